#!/usr/bin/env python3
"""Sparse kernels vs dense ATen on a Linear layer: speedups and the crossover sparsity.

Runs the Google Benchmark binary (bench/kernels/sparse_linear.cpp) with repetitions in random
interleaving, takes medians, and for each shape (768->3072, 3072->768), batch (1, 8, 32, 128) and
sparsity (50-95%) reports the fastest lopper kernel for an unstructured weight (CSR kernels) and
for a block-pruned one (8x1, 4x1, 1x4 blocks), as a speedup over dense ATen (at::linear: MKL in
the torch wheel) and over the faster of ATen and oneDNN (what lopper runs for a dense layer).

    .venv/bin/python bench/sparse_kernels.py [--bench build/bench/lopper_kernel_bench]
        [--repetitions 3] [--min-time 0.2] [--out docs/bench-sparse-kernels.json] [--quick]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from collections import defaultdict

SPARSITIES = [50, 70, 80, 90, 95]


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(bench, repetitions, min_time, filt):
    cmd = [bench, "--benchmark_format=json", f"--benchmark_repetitions={repetitions}",
           "--benchmark_enable_random_interleaving=true", f"--benchmark_min_time={min_time}"]
    if filt:
        cmd.append(f"--benchmark_filter={filt}")
    print("running:", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    times = defaultdict(list)  # (kernel, in, out, batch, sparsity) -> [us]
    meta = {}
    data = json.loads(out)
    for b in data["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        name = b["run_name"]  # e.g. csr-cols/in:768/out:3072/batch:1/sparsity:90/real_time
        parts = name.split("/")
        args = dict(p.split(":") for p in parts[1:] if ":" in p)
        kernel = parts[0].replace("BM_", "")
        key = (kernel, int(args["in"]), int(args["out"]), int(args["batch"]), int(args["sparsity"]))
        times[key].append(b["real_time"])  # microseconds
        meta["threads"] = int(b.get("aten_threads", 0))
        meta["isa"] = b.get("label", meta.get("isa", ""))
    meta["context"] = data.get("context", {})
    return {k: statistics.median(v) for k, v in times.items()}, meta


def best(times, kernels, shape, sp):
    cands = [(times[(k, *shape, sp)], k) for k in kernels if (k, *shape, sp) in times]
    return min(cands) if cands else (None, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/bench/lopper_kernel_bench")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--out", default="docs/bench-sparse-kernels.json")
    ap.add_argument("--quick", action="store_true", help="batch 1 and 32 of 768->3072 only, no file")
    ap.add_argument("--from-json", help="print the tables of an earlier run's JSON, run nothing")
    args = ap.parse_args()
    if args.from_json:
        saved = json.load(open(args.from_json))
        times = {(t["kernel"], t["in"], t["out"], t["batch"], t["sparsity"]): t["us"] for t in saved["times_us"]}
        meta = {"threads": saved["machine"]["threads"], "isa": saved["machine"]["sparse_isa"]}
        args.quick = True  # print only
    else:
        if not os.access(args.bench, os.X_OK):
            sys.exit(f"sparse_kernels.py: no benchmark binary at {args.bench} (build it: make build)")
        filt = "in:768/out:3072/batch:(1|32)/" if args.quick else ""
        times, meta = run(args.bench, 1 if args.quick else args.repetitions, args.min_time, filt)

    kernels = sorted({k[0] for k in times})
    csr = [k for k in kernels if k.startswith("csr-")]
    blocks = [k for k in kernels if k.startswith("bcsr")]
    rows = []
    for (kern, i, o, b, sp) in sorted(times):
        if kern != "DenseAten":
            continue
        shape = (i, o, b)
        aten = times[("DenseAten", *shape, sp)]
        dnn = times.get(("DenseOnednn", *shape, sp), aten)
        dense = min(aten, dnn)
        for s in SPARSITIES:
            for pattern, ks in (("unstructured", csr), ("block", blocks)):
                t, k = best(times, ks, shape, s)
                if t is None:
                    continue
                rows.append({"in": i, "out": o, "batch": b, "sparsity": s, "pattern": pattern,
                             "kernel": k, "us": t, "aten_us": aten, "onednn_us": dnn,
                             "speedup_vs_aten": aten / t, "speedup_vs_best_dense": dense / t})

    def crossover(i, o, b, pattern, key):
        # The lowest measured sparsity from which every higher one is faster than the peer.
        pts = sorted((r["sparsity"], r[key]) for r in rows
                     if (r["in"], r["out"], r["batch"], r["pattern"]) == (i, o, b, pattern))
        c = None
        for sp, x in reversed(pts):
            if x < 1.0:
                break
            c = sp
        if c is None:
            return f">{SPARSITIES[-1]}%"
        return f"≤{c}%" if c == SPARSITIES[0] else f"{c}%"

    print(f"\n{cpu_model()}, {meta.get('threads')} thread(s) per benchmark, ATen threads as lopper bench; "
          f"sparse ISA {meta.get('isa')}")
    for pattern in ("unstructured", "block"):
        print(f"\n### {pattern}: fastest lopper kernel, speedup over dense ATen (over the faster of ATen and oneDNN)\n")
        print("| layer | batch | " + " | ".join(f"{s}%" for s in SPARSITIES) +
              " | ATen µs | crossover vs ATen | vs best dense |")
        print("|---|---|" + "---|" * len(SPARSITIES) + "---|---|---|")
        for (i, o, b) in sorted({(r["in"], r["out"], r["batch"]) for r in rows}):
            cells, aten = [], None
            for s in SPARSITIES:
                r = next((r for r in rows if (r["in"], r["out"], r["batch"], r["sparsity"], r["pattern"]) ==
                          (i, o, b, s, pattern)), None)
                if r is None:
                    cells.append("–")
                    continue
                aten = r["aten_us"]
                cells.append(f"{r['speedup_vs_aten']:.2f}× ({r['speedup_vs_best_dense']:.2f}×) {r['kernel']}")
            print(f"| {i}→{o} | {b} | " + " | ".join(cells) + f" | {aten:.0f} | " +
                  crossover(i, o, b, pattern, "speedup_vs_aten") + " | " +
                  crossover(i, o, b, pattern, "speedup_vs_best_dense") + " |")
    if args.quick:
        return
    result = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": meta.get("threads"),
                          "sparse_isa": meta.get("isa")},
              "command": " ".join([sys.executable] + sys.argv), "repetitions": args.repetitions,
              "rows": rows, "times_us": [{"kernel": k[0], "in": k[1], "out": k[2], "batch": k[3],
                                          "sparsity": k[4], "us": v} for k, v in sorted(times.items())]}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, args.out)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
