"""lopper's PEP 517 build backend: what `pip install .`, `pip wheel .` and `pip install -e .` run.

NOTE: why not setuptools or scikit-build-core: the extension must be compiled against the torch
of the interpreter it is installed into (its libtorch and headers), and pip's isolated build
environment has no torch; installing one there is several GB and could be another version. So
this backend asks the target interpreter itself, outside pip's isolation, where its torch is,
runs CMake on the target lopper_python (Release, Ninja, ccache: the project's own build), and
packs the package folder the build writes (BUILD/python/lopper) into a wheel that requires that
torch version (and numpy, and the oneDNN wheel lopper loads at run time). The rest of the metadata is pyproject.toml's [project]; the version is
CMakeLists.txt's.

The CMake build folder (pip -C build-dir=DIR, or --config-settings build-dir=DIR):
  - DIR when given (configured there if new);
  - else the project's build/ when it is configured against this interpreter's torch (after
    `make build`, `pip install .` only packs what is built);
  - else build/pip-<hash of the torch folder>, configured for this interpreter.
The build needs what scripts/install-deps.sh installs (CMake, Ninja, a C++ compiler, protobuf,
...), as `make build` does.
"""
import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11 (pyproject.toml's build requires add tomli there)
    import tomli as tomllib

SOURCE = Path(__file__).resolve().parent.parent
NAME = "lopper"


def _say(msg):
    print(f"[lopper build] {msg}", file=sys.stderr, flush=True)


def _clean_env():
    """The environment without pip's isolation, so the interpreter sees its own site-packages."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONNOUSERSITE"):
        env.pop(k, None)
    return env


def _target_torch():
    """{version, cmake_prefix_path} of the torch the target interpreter imports."""
    code = ("import json, torch, torch.utils; print(json.dumps({'version': torch.__version__, "
            "'cmake_prefix_path': torch.utils.cmake_prefix_path}))")
    r = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True,
                       text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(
            f"lopper is built against the torch of the interpreter it installs into, and "
            f"{sys.executable} cannot import torch ({last}): install torch there first "
            f"(scripts/requirements.txt pins the one lopper is tested with)")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _project():
    meta = tomllib.loads((SOURCE / "pyproject.toml").read_text())["project"]
    cmake = (SOURCE / "CMakeLists.txt").read_text()
    m = re.search(r"project\(lopper VERSION ([0-9.]+)", cmake)
    if not m:
        raise RuntimeError("no `project(lopper VERSION x.y.z)` in CMakeLists.txt")
    meta["version"] = m.group(1)
    return meta


def _cache_value(build_dir, key):
    cache = Path(build_dir) / "CMakeCache.txt"
    if not cache.is_file():
        return None
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith(key + ":"):
            return line.split("=", 1)[1]
    return None


def _torch_dir(torch):
    return os.path.realpath(os.path.join(torch["cmake_prefix_path"], "Torch"))


def _build_dir(config_settings, torch):
    given = (config_settings or {}).get("build-dir")
    if given:
        return Path(given).resolve()
    default = SOURCE / "build"
    cached = _cache_value(default, "Torch_DIR")
    if cached and os.path.realpath(cached) == _torch_dir(torch):
        return default
    digest = hashlib.sha256(_torch_dir(torch).encode()).hexdigest()[:8]
    return SOURCE / "build" / f"pip-{digest}"


def _run(cmd):
    line = " ".join(str(c) for c in cmd)
    _say(line)
    r = subprocess.run([str(c) for c in cmd], env=_clean_env(), stdout=sys.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"`{line}` failed (exit {r.returncode}): see its output above; "
                           f"scripts/install-deps.sh installs what lopper's build needs")


def _build(config_settings):
    """Builds the extension; returns (package folder, torch)."""
    torch = _target_torch()
    build_dir = _build_dir(config_settings, torch)
    if not (build_dir / "CMakeCache.txt").is_file():
        _run(["cmake", "-S", SOURCE, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
              f"-DLOPPER_PYTHON={sys.executable}"]
             + (["-DLOPPER_TESTS=OFF"] if build_dir != SOURCE / "build" else []))
    elif os.path.realpath(_cache_value(build_dir, "Torch_DIR") or "") != _torch_dir(torch):
        raise RuntimeError(f"{build_dir} is configured against another torch than "
                           f"{sys.executable}'s: pass another build-dir")
    _run(["cmake", "--build", build_dir, "--target", "lopper_python"])
    package = build_dir / "python" / NAME
    info = {}
    exec((package / "_build_info.py").read_text(), info)
    if info["TORCH_VERSION"] != torch["version"]:
        raise RuntimeError(f"{package} was built against torch {info['TORCH_VERSION']}, "
                           f"{sys.executable} has {torch['version']}")
    return package, torch


def _metadata(project, torch=None):
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}",
             f"Summary: {project['description']}"]
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    if torch:
        public = torch["version"].split("+")[0]  # the local label (+cu130) is checked at import
        lines.append(f"Requires-Dist: torch=={public}")
    lines.append("Requires-Dist: numpy")
    # oneDNN on GNU OpenMP, whose primitives lopper calls directly (loaded at run time where
    # present: the package runs without it, slower where oneDNN's kernels win)
    lines.append("Requires-Dist: onednn-cpu-gomp==2023.2.0")
    readme = SOURCE / project.get("readme", "README.md")
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + readme.read_text()


def _tag():
    impl = {"cpython": "cp"}.get(sys.implementation.name, sys.implementation.name[:2])
    ver = f"{sys.version_info.major}{sys.version_info.minor}"
    plat = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return f"{impl}{ver}-{impl}{ver}-{plat}"


def _dist_info(project):
    return f"{project['name']}-{project['version']}.dist-info"


def _dist_info_files(project, torch, tag):
    wheel = (f"Wheel-Version: 1.0\nGenerator: lopper build_backend\nRoot-Is-Purelib: false\n"
             f"Tag: {tag}\n")
    return {"METADATA": _metadata(project, torch), "WHEEL": wheel, "top_level.txt": NAME + "\n"}


def _write_wheel(wheel_directory, project, torch, files):
    """files: {path in the wheel: bytes}; adds the .dist-info and RECORD."""
    tag = _tag()
    info = _dist_info(project)
    for name, text in _dist_info_files(project, torch, tag).items():
        files[f"{info}/{name}"] = text.encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([path, f"sha256={digest}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue().encode()
    filename = f"{project['name']}-{project['version']}-{tag}.whl"
    out = Path(wheel_directory) / filename
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            zi = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    _say(f"wrote {out}")
    return filename


def _write_metadata(metadata_directory, torch):
    project = _project()
    info = Path(metadata_directory) / _dist_info(project)
    info.mkdir(parents=True, exist_ok=True)
    for name, text in _dist_info_files(project, torch, _tag()).items():
        (info / name).write_text(text)
    return info.name


# --- PEP 517 hooks ---------------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory, _target_torch())


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory, _target_torch())


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    package, torch = _build(config_settings)
    # The package's sources (not a copy the build folder kept of a file since removed), the
    # generated _build_info.py and the extension.
    names = sorted(f.name for f in (SOURCE / "python" / NAME).glob("*.py"))
    names += ["_build_info.py", f"_{NAME}{sysconfig.get_config_var('EXT_SUFFIX')}",
              "liblopper_cuda.so"]
    files = {f"{NAME}/{n}": (package / n).read_bytes() for n in names}
    return _write_wheel(wheel_directory, _project(), torch, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel whose .pth puts the build folder's python/ on sys.path: rebuilding (make build, or
    cmake --build BUILD --target lopper_python) updates the installed package."""
    package, torch = _build(config_settings)
    return _write_wheel(wheel_directory, _project(), torch,
                        {f"_{NAME}_editable.pth": f"{package.parent}\n".encode()})


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = f"{project['name']}-{project['version']}"
    r = subprocess.run(["git", "ls-files", "-z"], cwd=SOURCE, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError("an sdist is made from a git checkout (git ls-files)")
    names = [n for n in r.stdout.decode().split("\0") if n and (SOURCE / n).is_file()]
    out = Path(sdist_directory) / f"{base}.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for n in names:
            tar.add(SOURCE / n, arcname=f"{base}/{n}", recursive=False)
        pkg_info = _metadata(project).encode()  # no torch pin: that is chosen when it is built
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(pkg_info)
        ti.mode = 0o644
        tar.addfile(ti, io.BytesIO(pkg_info))
    return out.name
