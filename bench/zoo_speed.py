"""lopper vs ONNX Runtime on the whole torchvision classification zoo, dense and 50%-structured.

For every torchvision classification builder (random weights, fixed seed, eval mode; bench/zoo_check.py
builds and exports them the same way) the model is exported once (TorchScript exporter, opset 17,
batch 1), pruned with `lopper prune --structured channel --amount A`, and both files are timed in
ONNX Runtime (in-process, intra-op threads = T, inter-op 1, all graph optimizations) and in lopper
(`lopper bench --json`, its own latency helper), the two taking turns for --rounds rounds, the
order swapped each round; each figure is the median of the round medians, with the spread (p90 /
median, worst round of the two), and the ratio lopper / ORT the median of the rounds' own ratios
(paired: a slow spell of the machine that spans a round hits both runtimes).
The end prints the distribution of lopper / ORT (dense and structured): median, 90th percentile,
worst, and how many models are above 1.0 and 1.1. A model whose export or pruning fails is listed
with the reason and left out of the distribution.

Usage: .venv/bin/python bench/zoo_speed.py --lopper build/lopper [--only a,b] [--amount 0.5]
       [--threads 2] [--rounds 3] [--iters 20] [--round-ms 300] [--max-params 100e6]
       [--json out.json]
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from structured import ort_ms, ort_session  # noqa: E402  bench/structured.py
from zoo_check import Skip, build, export, first_line, tv_models  # noqa: E402


def lopper_round(lopper, path, threads, iters, warmup):
    r = subprocess.run([lopper, "bench", path, "--threads", str(threads), "--iters", str(iters),
                        "--warmup", str(warmup), "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("lopper bench: " + first_line(r.stderr))
    j = json.loads(r.stdout)
    return float(j["median_ms"]), float(j["spread"])


def compare(lopper, path, x, a):
    """(lopper ms, ORT ms, spread, ratio, runs a round, [lopper ms, ORT ms] a round) for one file,
    the two taking turns: each figure the median of its round medians, the ratio the median of the
    rounds' own ratios (a round's two runs are seconds apart, so a slow spell of the machine that
    spans them hits both), the order swapped from one round to the next. A round is --iters runs,
    or as many as fill --round-ms (ONNX Runtime's time probed first): ten runs of a 2 ms model
    last less than one of a shared machine's slow spells."""
    sess = ort_session(path, a.threads)
    probe = ort_ms(sess, x, 3)[0]
    iters = max(a.iters, math.ceil(a.round_ms / max(probe, 1e-3)))
    warmup = max(2, iters // 10)
    lo, oo = [], []
    turns = [lambda: oo.append(ort_ms(sess, x, iters)),
             lambda: lo.append(lopper_round(lopper, path, a.threads, iters, warmup))]
    for r in range(a.rounds):
        for turn in turns if r % 2 == 0 else turns[::-1]:
            turn()
    return (statistics.median(m for m, _ in lo), statistics.median(m for m, _ in oo),
            max(sp for _, sp in lo + oo), statistics.median(l[0] / o[0] for l, o in zip(lo, oo)),
            iters, [[round(l[0], 4), round(o[0], 4)] for l, o in zip(lo, oo)])


def distribution(ratios):
    r = sorted(ratios)
    if not r:
        return "no model"
    p90 = r[min(len(r) - 1, int(round(0.9 * (len(r) - 1))))]
    return (f"{len(r)} models: median {statistics.median(r):.2f}, p90 {p90:.2f}, worst {r[-1]:.2f}; "
            f"above 1.0: {sum(v > 1.0 for v in r)}, above 1.1: {sum(v > 1.1 for v in r)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", default="build/lopper")
    ap.add_argument("--only", default="")
    ap.add_argument("--amount", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20, help="runs a round, at least")
    ap.add_argument("--round-ms", type=float, default=300,
                    help="a round's runs fill at least this many ms (default %(default)s)")
    ap.add_argument("--max-params", type=float, default=100e6)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    names = a.only.split(",") if a.only else tv_models()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LOPPER_CACHE_DIR"] = os.path.join(tmp, "cache")
        for name in names:
            row = {"model": name}
            try:
                model, x = build(name, a.max_params)
                dense = os.path.join(tmp, name + ".onnx")
                pruned = os.path.join(tmp, name + ".pruned.onnx")
                export(model, x, dense, "ts")
                xn = x.numpy()
                (row["lopper_ms"], row["ort_ms"], row["spread"], row["ratio"], row["iters"],
                 row["rounds"]) = compare(a.lopper, dense, xn, a)
                r = subprocess.run([a.lopper, "prune", dense, "-o", pruned, "--structured", "channel",
                                    "--amount", str(a.amount), "--json"], capture_output=True, text=True)
                if r.returncode != 0:
                    row["pruned_error"] = "lopper prune: " + first_line(r.stderr)
                else:
                    j = json.loads(r.stdout)
                    row["macs_ratio"] = j["macs"] / max(j["macs_before"], 1)
                    (row["lopper_pruned_ms"], row["ort_pruned_ms"], row["pruned_spread"],
                     row["pruned_ratio"], row["pruned_iters"],
                     row["pruned_rounds"]) = compare(a.lopper, pruned, xn, a)
                for f in (dense, pruned):
                    if os.path.exists(f):
                        os.remove(f)
            except Skip as e:
                row["skip"] = str(e)
            except Exception as e:  # noqa: BLE001  (an export or a run that fails: listed, not fatal)
                row["error"] = first_line(str(e)) or type(e).__name__
            rows.append(row)
            line = f"{name:28s}"
            if "lopper_ms" in row:
                line += (f" dense {row['lopper_ms']:8.2f} / {row['ort_ms']:8.2f} ms, paired "
                         f"{row['ratio']:.2f} (spread {row['spread']:.2f})")
            if "lopper_pruned_ms" in row:
                line += (f"  50%: {row['lopper_pruned_ms']:8.2f} / {row['ort_pruned_ms']:8.2f} ms, paired "
                         f"{row['pruned_ratio']:.2f} "
                         f"(spread {row['pruned_spread']:.2f}, MACs {row['macs_ratio']:.2f})")
            for k in ("skip", "error", "pruned_error"):
                if k in row:
                    line += f"  {k}: {row[k]}"
            print(line, flush=True)
    dense = [r["ratio"] for r in rows if "ratio" in r]
    pruned = [r["pruned_ratio"] for r in rows if "pruned_ratio" in r]
    print(f"\nlopper / ONNX Runtime, dense: {distribution(dense)}")
    print(f"lopper / ONNX Runtime, {a.amount:.0%}-structured: {distribution(pruned)}")
    if a.json:
        import onnxruntime as ort

        meta = dict(threads=a.threads, rounds=a.rounds, iters=a.iters, round_ms=a.round_ms, amount=a.amount,
                    onnxruntime=ort.__version__, torch=torch.__version__, cores=os.cpu_count())
        with open(a.json + ".tmp", "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
