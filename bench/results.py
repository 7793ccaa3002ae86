"""What the benchmarks share when they write their results: the file, the means over seeds, the
commit they measured."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def save_json(path, obj, indent=2, **kw):
    """Writes `obj` as JSON to `path` through a temporary file, so a run cut short leaves the last
    complete results in place. `kw` goes to json.dump (default=str, say)."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=indent, **kw)
    os.replace(path + ".tmp", path)


def mean(xs):
    return sum(xs) / len(xs)


def git_rev():
    """The checkout's short HEAD, "+dirty" when a tracked file differs from it; "" without git."""
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except OSError:
        return ""


def cpu_model():
    """The CPU's model name and the ISA extensions its timings depend on (AVX-512, bf16, AMX), for
    the record: a figure holds on the machine kind it was measured on."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        import platform

        return platform.processor()
    name = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in text.splitlines() if l.startswith("flags")), [])
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return f"{name} ({', '.join(isa)})"
