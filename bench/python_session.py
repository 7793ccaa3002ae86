"""lopper.InferenceSession vs onnxruntime.InferenceSession from Python, on a 90%-sparse BERT-base encoder.

The model is bench/sparse_e2e.py's: nn.TransformerEncoder, --layers (12) x
TransformerEncoderLayer(d_model 768, 12 heads, FFN 3072, GELU, dropout 0, batch_first), every
parameter its own random values, exported once (TorchScript exporter, opset 17, static shape
[--batch, --seq, 768]); then `lopper prune --method l1 --amount 0.9` (90% of every Gemm/MatMul
weight, per layer, stored dense: the file every runtime reads is the same). The dense export is
timed too, for reference.

Both sessions are made in this process on the same file and timed on the same numpy input through
the same call, `sess.run(None, {"x": x})`:
  * `lopper.InferenceSession(path, threads=T)` (its first run picks the kernel per layer by timing
    them; it is the untimed warm-up);
  * `onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])` with
    intra_op_num_threads = T, inter_op 1, sequential, all graph optimisations (as
    bench/compare_runtimes.py and bench/sparse_e2e.py set it).
A measurement is the median of --iters timed runs after --warmup (bench/timing.py); the two
sessions take turns for --rounds rounds, the order reversed every other round; the figure is the
median of the round medians and the spread is the lowest and highest round median. Before timing,
lopper's output is compared with ONNX Runtime's (max |y - y_ort| / max |y_ort|). With --cli,
`lopper bench --json` (the CLI, one child process per measurement, same warm-up and iterations)
takes its turn too: the same executor without Python. It is a fresh process beside this one, which
holds all four sessions' weights, and has measured up to 1.5x its time alone on the dense model here:
compare it with care.

Ratios are speedups: "lopper vs ORT" = time(ORT) / time(lopper); above 1 means lopper is faster.

Usage: PYTHONPATH=build/python .venv/bin/python bench/python_session.py --lopper build/lopper
       [--threads 2] [--layers 12] [--seq 128] [--batch 1] [--rounds 5] [--iters 10] [--warmup 2]
       [--cli] [--work DIR] [--json PATH]
"""

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from options import int_options  # noqa: E402 (bench/options.py)
from results import git_rev, save_json  # noqa: E402 (bench/results.py)
from sparse_e2e import build_bert, cpu_info, lopper_bench, lopper_prune, rel_err  # noqa: E402
from timing import median_ms  # noqa: E402 (bench/timing.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AMOUNT = 0.9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", default=os.path.join(ROOT, "build", "lopper"),
                    help="the CLI that prunes the export (default %(default)s)")
    int_options(ap, threads=2, layers=12, seq=128, batch=1, rounds=5, iters=10, warmup=2)
    ap.add_argument("--cli", action="store_true",
                    help="also time `lopper bench` (the CLI, a child process) on the same files")
    ap.add_argument("--work", help="keep the models here (default: a temp dir)")
    ap.add_argument("--json", help="write the rows and the machine here")
    a = ap.parse_args()
    if not os.access(a.lopper, os.X_OK):
        sys.exit(f"{a.lopper} not found: build it first (make build, or ninja -C <build> lopper)")

    import onnxruntime as ort
    import torch

    import lopper

    torch.set_num_threads(a.threads)
    work = a.work or tempfile.mkdtemp(prefix="lopper_python_session_")
    os.makedirs(work, exist_ok=True)
    try:
        load_start = os.getloadavg()
        print(f"load average at start: {load_start[0]:.2f}", flush=True)
        t0 = time.perf_counter()
        dense = os.path.join(work, "bert-base-encoder.onnx")
        shape = build_bert(dense, a.layers, a.batch, a.seq)
        print(f"exported {dense} {shape} in {time.perf_counter() - t0:.1f}s", flush=True)
        sparse = os.path.join(work, "bert-base-encoder.pruned.onnx")
        info = lopper_prune(a.lopper, dense, sparse, ["--method", "l1", "--amount", str(AMOUNT)])
        print(f"pruned: {info['layers_pruned']} layers, sparsity {info['sparsity']:.3f} of their weights "
              f"({info['prune_s']}s)", flush=True)

        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        feeds = {"x": x}
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL

        models = {"dense": dense, "pruned 90%": sparse}
        sessions, checks, load_s = {}, {}, {}
        for key, path in models.items():
            t0 = time.perf_counter()
            s_ort = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            t1 = time.perf_counter()
            s_lop = lopper.InferenceSession(path, threads=a.threads)
            t2 = time.perf_counter()
            ref = s_ort.run(None, feeds)[0].astype(np.float64)
            t3 = time.perf_counter()
            y = s_lop.run(None, feeds)[0]  # the first run picks the kernels
            t4 = time.perf_counter()
            sessions[key] = {"ort": s_ort, "lopper": s_lop}
            checks[key] = rel_err(y, ref)
            load_s[key] = {"ort_load_s": round(t1 - t0, 2), "lopper_load_s": round(t2 - t1, 2),
                           "ort_first_run_s": round(t3 - t2, 3), "lopper_first_run_s": round(t4 - t3, 3)}
            print(f"{key}: output {list(y.shape)}, max |y_lopper - y_ort| / max |y_ort| = {checks[key]:.1e}; "
                  f"load ORT {t1 - t0:.2f}s, lopper {t2 - t1:.2f}s; first run ORT {t3 - t2:.2f}s, "
                  f"lopper {t4 - t3:.2f}s", flush=True)

        runtimes = ("ort", "lopper") + (("cli",) if a.cli else ())
        jobs = [(key, rt) for key in models for rt in runtimes]
        per_round = {j: [] for j in jobs}
        for r in range(a.rounds):
            for key, rt in (jobs if r % 2 == 0 else jobs[::-1]):
                if rt == "cli":
                    ms = lopper_bench(a.lopper, models[key], a.threads, a.warmup, a.iters)
                else:
                    s = sessions[key][rt]
                    ms = median_ms(lambda: s.run(None, feeds), a.warmup, a.iters)
                per_round[(key, rt)].append(ms)
                print(f"round {r + 1}/{a.rounds}  {rt:7s} {key:11s} {ms:9.2f} ms", flush=True)
                time.sleep(0.2)  # let the last runtime's spinning threads settle

        rows = []
        for key in models:
            o, l = per_round[(key, "ort")], per_round[(key, "lopper")]
            mo, ml = statistics.median(o), statistics.median(l)
            rows.append({"model": key, "ort_ms": round(mo, 2), "ort_range_ms": [round(min(o), 2), round(max(o), 2)],
                         "lopper_ms": round(ml, 2), "lopper_range_ms": [round(min(l), 2), round(max(l), 2)],
                         "lopper_vs_ort": round(mo / ml, 3), "rel_err": checks[key],
                         "ort_rounds_ms": [round(v, 2) for v in o], "lopper_rounds_ms": [round(v, 2) for v in l],
                         **load_s[key]})
            if a.cli:
                c = per_round[(key, "cli")]
                rows[-1].update(cli_ms=round(statistics.median(c), 2), cli_rounds_ms=[round(v, 2) for v in c])
        cpu, flags = cpu_info()
        meta = {"machine": cpu, "isa": flags, "cores": os.cpu_count(), "threads": a.threads,
                "platform": platform.platform(), "python": platform.python_version(),
                "torch": torch.__version__, "onnxruntime": ort.__version__,
                "lopper": f"{lopper.__version__} ({lopper.__file__})", "git": git_rev(),
                "command": " ".join(["bench/python_session.py"] + sys.argv[1:]),
                "date": time.strftime("%Y-%m-%d"), "loadavg_start": [round(v, 2) for v in load_start],
                "loadavg_end": [round(v, 2) for v in os.getloadavg()], "layers": a.layers, "seq": a.seq,
                "batch": a.batch, "rounds": a.rounds, "iters": a.iters, "warmup": a.warmup,
                "amount": AMOUNT, "prune": info,
                "speedup": "lopper vs ORT = time(ORT) / time(lopper); > 1: lopper is faster"}

        print("\n| model | onnxruntime.InferenceSession ms (range) | lopper.InferenceSession ms (range) "
              "| lopper vs ORT | max rel diff |" + (" `lopper bench` ms |" if a.cli else ""))
        print("|---|---|---|---|---|" + ("---|" if a.cli else ""))
        for r in rows:
            print(f"| BERT-base encoder, {r['model']} | {r['ort_ms']:.2f} ({r['ort_range_ms'][0]:.2f}–"
                  f"{r['ort_range_ms'][1]:.2f}) | {r['lopper_ms']:.2f} ({r['lopper_range_ms'][0]:.2f}–"
                  f"{r['lopper_range_ms'][1]:.2f}) | {r['lopper_vs_ort']:.2f}× | {r['rel_err']:.1e} |"
                  + (f" {r['cli_ms']:.2f} |" if a.cli else ""))
        print(f"\n{cpu} ({', '.join(flags)}), {os.cpu_count()} cores, {a.threads} threads; ORT {ort.__version__}, "
              f"torch {torch.__version__}; {a.rounds} rounds x {a.iters} iters; load average "
              f"{meta['loadavg_start'][0]} at start, {meta['loadavg_end'][0]} at the end")
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            save_json(a.json, {"meta": meta, "rows": rows}, indent=1)
            print(f"wrote {a.json}")
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:  # a lopper command that failed: its message, not a traceback
        sys.exit(f"error: {e}")
