"""lopper's CPU speed targets against the peers a user would otherwise run, checked on the results of
one machine: each target with its bound, the figures measured, and whether it holds there.

The figures come from the four benchmarks' JSON files (their own runs, the runtimes taking turns
round by round); --run makes the missing ones first, with the settings below, into --dir (about
45 minutes on a 2-core machine), and prints which of oneDNN's implementations the direct
primitives run on ResNet-50 and BERT in bf16 (names ending in avx512_core_amx: AMX tiles). A target holds on the machine it was measured on: the CPU is
named, and the bf16 targets differ with AMX.

  bf16 (lopper at --precision bf16 where that is faster than its fp32, against OpenVINO's default,
  which is bf16 on a CPU with bf16 arithmetic):
    - lopper's best / OpenVINO's default <= 1.0 on every model of compare_runtimes.py and of
      structured.py, dense and 50%-structured (with AMX; reported, not a target, without);
    - lopper bf16 / lopper fp32 <= 0.6 with AMX, <= 1.0 without.
  fp32: lopper / ONNX Runtime <= 1.0 and lopper / OpenVINO f32 <= 1.0 on every model of both,
    dense and 50%-structured.
  sparse (sparse_e2e.py's BERT-base encoder, llm_decode.py's decoding step), against OpenVINO's
  default on the dense model: the 90%-unstructured encoder >= 2x, the 8x1-block one >= 3x, the
  50%-unstructured and the 2:4 step >= 1.5x; lopper's bf16 sparse / fp32 sparse <= 0.7.

Usage: .venv/bin/python bench/cpu_targets.py [--run] [--dir DIR] [--lopper build/lopper]
       [--runtimes J] [--structured J] [--sparse J] [--decode J] [--json OUT]
Exit status 0 when every target with figures holds, 1 when one does not, 2 on bad input or no
results.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ROOT, cpu_model, git_rev, save_json  # noqa: E402

PY = sys.executable


def commands(lopper, out):
    """The benchmark runs --run makes, each writing the JSON file `out[name]`."""
    bench = os.path.join(ROOT, "bench")
    fixtures = os.path.join(ROOT, "build", "fixtures")
    return {
        "runtimes": [PY, f"{bench}/compare_runtimes.py", "--lopper", lopper, "--batches", "1",
                     "--rounds", "3", "--bf16", "--out", out["runtimes"]],
        "structured": [PY, f"{bench}/structured.py", "--lopper", lopper, "--fixtures", fixtures,
                       "--rounds", "3", "--bf16", "--json", out["structured"]],
        "sparse": [PY, f"{bench}/sparse_e2e.py", "--lopper", lopper, "--models", "bert", "--rounds",
                   "3", "--bf16", "--deepsparse-python", "", "--json", out["sparse"]],
        "decode": [PY, f"{bench}/llm_decode.py", "--lopper", lopper, "--rounds", "3", "--out",
                   out["decode"]],
    }


def direct_implementations(lopper, models):
    """{model: {oneDNN's implementation name: layers}} of each model's onednn-direct candidates in
    bf16 (`lopper bench --explain --json`): where AMX runs, the names end in avx512_core_amx."""
    found = {}
    for m in models:
        r = subprocess.run([lopper, "bench", m, "--precision", "bf16", "--iters", "2", "--warmup", "1",
                            "--explain", "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            found[os.path.basename(m)] = {f"failed: {r.stderr.strip()[-200:]}": 0}
            continue
        counts = {}
        for layer in json.loads(r.stdout).get("kernels", {}).get("layers", []):
            impl = layer.get("implementations", {}).get("onednn-direct")
            if impl:
                counts[impl] = counts.get(impl, 0) + 1
        found[os.path.basename(m)] = counts
    return found


class Check:
    """The targets' verdicts, printed as a table."""

    def __init__(self):
        self.rows = []

    def bound(self, target, what, value, limit, above=False, target_here=True):
        """value <= limit (or >= with above); a None value: not measured."""
        if value is None:
            verdict = "not measured"
        elif not target_here:
            verdict = "reported"
        else:
            verdict = "holds" if (value >= limit if above else value <= limit) else "MISSED"
        self.rows.append({"target": target, "what": what, "value": value,
                          "bound": f"{'>=' if above else '<='} {limit}", "verdict": verdict})

    def missed(self):
        return any(r["verdict"] == "MISSED" for r in self.rows)

    def print(self):
        w = max(len(r["what"]) for r in self.rows) if self.rows else 10
        for r in self.rows:
            v = "-" if r["value"] is None else f"{r['value']:.3f}"
            print(f"{r['target']:7s} {r['what']:{w}s} {v:>7s} {r['bound']:>7s}  {r['verdict']}")


def load(path, name):
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"cpu_targets.py: --{name} {path}: {e}", file=sys.stderr)
        sys.exit(2)


def check_runtimes(c, d, amx):
    for r in d.get("rows", []):
        m = f"{r['model']} (runtimes)"
        c.bound("fp32", f"{m} lopper / ORT", r.get("lopper_over_ort"), 1.0)
        c.bound("fp32", f"{m} lopper / OpenVINO f32", r.get("lopper_over_openvino_f32"), 1.0)
        c.bound("bf16", f"{m} best / OpenVINO default", r.get("lopper_best_over_openvino"), 1.0,
                target_here=amx)
        c.bound("bf16", f"{m} bf16 / fp32", r.get("lopper_bf16_over_fp32"), 0.6 if amx else 1.0)


def check_structured(c, d, amx):
    for r in d.get("rows", []):
        for form in ("dense", "pruned"):
            m = f"{r['model']} {'dense' if form == 'dense' else '50%-structured'}"
            c.bound("fp32", f"{m} lopper / ORT", r.get(f"lopper_over_ort_{form}"), 1.0)
            c.bound("fp32", f"{m} lopper / OpenVINO f32", r.get(f"lopper_over_openvino_f32_{form}"),
                    1.0)
            c.bound("bf16", f"{m} best / OpenVINO default",
                    r.get(f"lopper_best_over_openvino_{form}"), 1.0, target_here=amx)
            c.bound("bf16", f"{m} bf16 / fp32", r.get(f"lopper_bf16_over_fp32_{form}"),
                    0.6 if amx else 1.0)


def check_sparse(c, d):
    for r in d.get("rows", []):
        if not r["model"].startswith("bert"):
            continue
        s = r.get("speedup", {})
        block = r.get("pattern", "").startswith("block")
        best = max((x for x in (s.get("lopper_sparse_vs_openvino_dense"),
                                s.get("lopper_bf16_sparse_vs_openvino_dense")) if x is not None),
                   default=None)
        c.bound("sparse", f"encoder {'8x1' if block else '90%'}: OpenVINO dense / lopper sparse",
                best, 3.0 if block else 2.0, above=True)
        fp32_over_bf16 = s.get("lopper_bf16_sparse_vs_lopper_sparse")
        c.bound("sparse", f"encoder {'8x1' if block else '90%'}: lopper bf16 / fp32 (sparse)",
                1 / fp32_over_bf16 if fp32_over_bf16 else None, 0.7)


def check_decode(c, d):
    ratios = d.get("ratios", {})
    for form in ("50%", "2:4"):
        best = max((x for k, x in ratios.items()
                    if k.startswith("OpenVINO dense default / lopper " + form)), default=None)
        c.bound("sparse", f"decode step {form}: OpenVINO dense / lopper", best, 1.5, above=True)
    ms = d.get("median_ms", {})
    for form in ("50", "2:4"):
        f32, b16 = ms.get(f"lopper {form} fp32"), ms.get(f"lopper {form} bf16")
        c.bound("sparse", f"decode step {form}{'%' if form == '50' else ''}: lopper bf16 / fp32",
                b16 / f32 if f32 and b16 else None, 0.7)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--run", action="store_true", help="run the benchmarks whose file is missing")
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "cpu-targets"))
    ap.add_argument("--lopper", default=os.path.join(ROOT, "build", "lopper"))
    for name in ("runtimes", "structured", "sparse", "decode"):
        ap.add_argument(f"--{name}", help=f"the {name} benchmark's JSON (default: DIR/{name}.json)")
    ap.add_argument("--json", help="write the verdicts here too")
    a = ap.parse_args()
    paths = {n: getattr(a, n) or os.path.join(a.dir, f"{n}.json")
             for n in ("runtimes", "structured", "sparse", "decode")}
    if a.run:
        os.makedirs(a.dir, exist_ok=True)
        if not os.access(a.lopper, os.X_OK):
            print(f"cpu_targets.py: no lopper at {a.lopper} (make build)", file=sys.stderr)
            sys.exit(2)
        for name, cmd in commands(a.lopper, paths).items():
            if os.path.exists(paths[name]):
                print(f"[cpu-targets] {name}: {paths[name]} exists, not run again", flush=True)
                continue
            print(f"[cpu-targets] {name}: {' '.join(cmd)}", flush=True)
            r = subprocess.run(cmd, cwd=ROOT)
            if r.returncode != 0:
                print(f"[cpu-targets] {name} failed (exit {r.returncode}); its targets are not "
                      "measured", flush=True)
    if a.run:  # which of oneDNN's implementations the direct primitives run (AMX's, where present)
        fixtures = os.path.join(ROOT, "build", "fixtures")
        models = [os.path.join(fixtures, f) for f in ("resnet50.ts.onnx", "bert.ts.onnx")]
        for model, counts in direct_implementations(
                a.lopper, [m for m in models if os.path.exists(m)]).items():
            print(f"[cpu-targets] {model} in bf16, oneDNN's direct primitives: " +
                  (", ".join(f"{impl} x{n}" for impl, n in sorted(counts.items())) or "none"),
                  flush=True)
    data = {n: load(p, n) if os.path.exists(p) or getattr(a, n) else None for n, p in paths.items()}
    # The CPU each file was measured on (a target holds on the machine it was measured on).
    recorded = {n: (d.get("meta", {}).get("cpu") or d.get("cpu")) for n, d in data.items() if d}
    cpus = sorted({c for c in recorded.values() if c})
    cpu = cpus[0] if len(cpus) == 1 else cpu_model()
    if len(cpus) > 1:
        print("warning: the files come from different CPUs: " +
              "; ".join(f"{n}: {c}" for n, c in recorded.items()))
    amx = any("amx_tile" in c for c in cpus) if cpus else "amx_tile" in cpu
    c = Check()
    if data["runtimes"]:
        check_runtimes(c, data["runtimes"], amx)
    if data["structured"]:
        check_structured(c, data["structured"], amx)
    if data["sparse"]:
        check_sparse(c, data["sparse"])
    if data["decode"]:
        check_decode(c, data["decode"])
    print(f"{cpu}; bf16 targets {'with' if amx else 'without'} AMX")
    for n, p in paths.items():
        if data[n] is None:
            print(f"(no {n} results: {p})")
    c.print()
    if a.json:
        save_json(a.json, {"cpu": cpu, "amx": amx, "git": git_rev(), "files": paths,
                           "targets": c.rows})
    if not c.rows:
        print("cpu_targets.py: no results to check (--run makes them)", file=sys.stderr)
        sys.exit(2)
    sys.exit(1 if c.missed() else 0)


if __name__ == "__main__":
    main()
