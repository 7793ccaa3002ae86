"""The package as people install it: the torch it was built against is checked at import, and
`pip wheel .` makes a wheel that installs and runs outside the source and build trees."""
import base64
import csv
import hashlib
import os
import subprocess
import sys
import time
import zipfile

import torch

from conftest import BUILD, SOURCE

CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_import_beside_another_torch_fails_with_one_line():
    code = "import torch; torch.__version__ = '2.0.0+other'; import lopper"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: lopper was built against torch {torch.__version__}, this "
                    f"interpreter has torch 2.0.0+other: rebuild lopper with this torch (pip "
                    f"install . in lopper's source folder), or install torch=={torch.__version__}")
    # The check runs before the extension loads (a mismatched one could fail on a C++ symbol).
    probe = ("import sys, torch; torch.__version__ = '0'\n"
             "try:\n    import lopper\nexcept ImportError:\n    pass\n"
             "print('lopper._lopper' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_source_tree_package_says_how_to_build(tmp_path):
    r = subprocess.run([sys.executable, "-c", "import lopper"], capture_output=True, text=True,
                       cwd=SOURCE / "python", env=CLEAN_ENV)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith(
        "ImportError: lopper's extension is not built here: pip install .")


def record_ok(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(z.read(record).decode().splitlines()))
        assert {r[0] for r in rows} == names
        for path, digest, size in rows:
            if path == record:
                continue
            data = z.read(path)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data), path
        meta = z.read(record.replace("RECORD", "METADATA")).decode()
    return names, meta


def test_wheel_installs_and_runs_outside_the_tree(tmp_path, multi_output_bytes):
    """pip wheel (through pip's build isolation and the in-tree backend, on this build folder;
    nothing is downloaded), pip install --target, import from elsewhere."""
    t0 = time.monotonic()
    dist, site = tmp_path / "dist", tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(SOURCE), "--no-deps",
                        "--no-index", "-w", str(dist), "-C", f"build-dir={BUILD}",
                        "--disable-pip-version-check"],
                       capture_output=True, text=True, env=CLEAN_ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = dist.glob("lopper-*.whl")
    names, meta = record_ok(wheel)
    ext = [n for n in names if n.startswith("lopper/_lopper.") and n.endswith(".so")]
    assert len(ext) == 1 and {"lopper/__init__.py", "lopper/_build_info.py"} <= names
    public = torch.__version__.split("+")[0]
    assert f"Requires-Dist: torch=={public}" in meta.splitlines()

    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                        "--target", str(site), str(wheel), "--disable-pip-version-check"],
                       capture_output=True, text=True, env=CLEAN_ENV)
    assert r.returncode == 0, r.stderr
    code = ("import sys, numpy as np, lopper\n"
            "sess = lopper.InferenceSession(sys.stdin.buffer.read())\n"
            "(y,) = sess.run(['relu'], {'x': np.array([[-1, 2, -3, 4]], np.float32)})\n"
            "print(lopper.__file__, y.tolist())")
    r = subprocess.run([sys.executable, "-c", code], input=multi_output_bytes, capture_output=True,
                       cwd=tmp_path, env={**CLEAN_ENV, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr.decode()
    where, result = r.stdout.decode().split(" ", 1)
    assert where == str(site / "lopper" / "__init__.py")
    assert result.strip() == "[[0.0, 2.0, 0.0, 4.0]]"
    print(f"wheel built, installed and imported in {time.monotonic() - t0:.1f} s")
