"""OpenVINO as a peer of the benches: it lives in its own venv (scripts/install-openvino.sh; its
pins clash with the project's), and every measurement is one process of bench/openvino_runner.py
there, as lopper's are `lopper bench` processes, so the runtimes take turns alike."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PYTHON = os.path.join(ROOT, ".venv-openvino", "bin", "python")


def resolve(python):
    """(python, None) when OpenVINO's venv is there, else (None, why it is not run). `python`:
    the venv's interpreter, "" or "none" to skip it."""
    if not python or python == "none":
        return None, "not run: skipped on the command line"
    if not os.path.exists(python):
        return None, f"not run: {python} does not exist (scripts/install-openvino.sh makes it)"
    return python, None


def measure(python, path, precision, threads, warmup, iters, shape=None, inputs=None):
    """openvino_runner.py's JSON (median_ms, spread, p10_ms, p90_ms, precision, version) for
    OpenVINO's CPU plugin on `path`, fed random data of `shape` as its first input, or the .npz
    `inputs` (every input by name); precision: "default" (OpenVINO's choice: bf16 where the CPU has
    bf16 arithmetic), "f32" or "bf16"."""
    feed = ["--inputs", inputs] if inputs else ["--shape", "x".join(str(d) for d in shape)]
    out = subprocess.run([python, os.path.join(ROOT, "bench", "openvino_runner.py"), path, *feed,
                          "--precision", precision, "--threads", str(threads), "--warmup",
                          str(warmup), "--iters", str(iters)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"openvino on {os.path.basename(path)}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def ms(python, path, shape, precision, threads, warmup, iters):
    """(median ms, p90/median, the precision that ran, OpenVINO's version): measure() of `shape`."""
    j = measure(python, path, precision, threads, warmup, iters, shape=shape)
    return j["median_ms"], j["spread"], j["precision"], j["version"]


def version(python):
    return json.loads(subprocess.run(
        [python, "-c", "import json, openvino; print(json.dumps(openvino.__version__))"],
        capture_output=True, text=True, check=True).stdout)
