"""Structured pruning pays on every runtime: each model pruned with `lopper prune --structured
channel --amount A`, then params, MACs, file size and latency of the dense and the shrunk model,
in ONNX Runtime and in lopper, in the same run. Latency is the median of --iters runs after a
warm-up, batch 1 (the fixtures' static shape), --threads intra-op threads on both runtimes; the four
runs of a model take turns for --rounds rounds and each figure is the median of its rounds' medians,
so that a slow spell of the machine hits all four alike; the spread (p90 / median, the worst round)
is printed beside each ratio. Inputs are random (speed only; accuracy after pruning needs
fine-tuning, see bench/accuracy.py). OpenVINO, where its venv exists (scripts/install-openvino.sh),
runs both files too, at its default precision (bf16 on a CPU with bf16 arithmetic) and at f32, one
process per measurement (bench/openvino_peer.py); --bf16 adds lopper at `--precision bf16`. All
runtimes take turns in every round; the CPU's model and ISA are recorded.

Models: the exported fixtures of tests/fixtures/make_models.py (torchvision, random weights).
Usage: bench/structured.py --lopper build/lopper --fixtures build/fixtures
       [--models resnet18.ts,resnet50.ts,...] [--amount 0.5] [--iters 20] [--rounds 3]
       [--threads 2] [--bf16] [--openvino .venv-openvino/bin/python | none]
       [--json docs/bench-structured.json]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import statistics

import numpy as np
import onnxruntime as ort

import openvino_peer  # bench/openvino_peer.py
from results import cpu_model, git_rev  # bench/results.py
from timing import median_spread, round_ratio  # bench/timing.py

DEFAULT = "resnet18.ts,resnet50.ts,mobilenet_v2.ts,vgg11_bn.ts,densenet121.ts,resnext50_32x4d.ts,vit_b_16.dynamo"


def ort_session(path, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def ort_ms(s, x, iters):
    """(median ms, spread) of ONNX Runtime's session on x."""
    name = s.get_inputs()[0].name
    s.run(None, {name: x})
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        s.run(None, {name: x})
        times.append(1000 * (time.perf_counter() - t0))
    return median_spread(times)


def lopper_ms(lopper, path, threads, iters, precision="fp32"):
    """(median ms, spread) from `lopper bench --json` (its own latency helper)."""
    r = subprocess.run([lopper, "bench", path, "--iters", str(iters), "--warmup", "2", "--threads",
                        str(threads), "--precision", precision, "--json"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"lopper bench {path} failed: {r.stderr}")
    j = json.loads(r.stdout)
    return float(j["median_ms"]), float(j["spread"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--amount", type=float, default=0.5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="lopper at --precision bf16 too")
    ap.add_argument("--openvino", default=openvino_peer.DEFAULT_PYTHON,
                    help="the python of OpenVINO's venv; none: skip it")
    ap.add_argument("--json")
    a = ap.parse_args()
    source = {"git": git_rev(), "date": time.strftime("%Y-%m-%d")}  # what is measured
    openvino, why = openvino_peer.resolve(a.openvino)
    if openvino is None:
        print(f"OpenVINO {why}", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # lopper's kernel choices are timed in this run (its first bench of each model), not taken
        # from a cache that another build of lopper filled.
        os.environ["LOPPER_CACHE_DIR"] = os.path.join(tmp, "cache")
        for stem in a.models.split(","):
            src = os.path.join(a.fixtures, stem + ".onnx")
            out = os.path.join(tmp, stem + ".pruned.onnx")
            t0 = time.perf_counter()
            r = subprocess.run([a.lopper, "prune", src, "-o", out, "--structured", "channel",
                                "--amount", str(a.amount), "--json"], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"prune {stem} failed: {r.stderr}")
            prune_s = time.perf_counter() - t0
            j = json.loads(r.stdout)
            x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
            row = dict(model=stem, amount=a.amount, prune_s=prune_s,
                       params=j["params"], params_before=j["params_before"],
                       macs=j["macs"], macs_before=j["macs_before"],
                       bytes=j["file_bytes_after"], bytes_before=j["file_bytes_before"],
                       barriers=j["barriers"])
            sessions = {"dense": ort_session(src, a.threads), "pruned": ort_session(out, a.threads)}
            peers = ["ort", "lopper"] + (["lopper_bf16"] if a.bf16 else [])
            peers += ["openvino", "openvino_f32"] if openvino else []
            runs = {f"{p}_{k}": [] for p in peers for k in ("dense", "pruned")}
            for _ in range(a.rounds):
                for kind, path in (("dense", src), ("pruned", out)):
                    runs["ort_" + kind].append(ort_ms(sessions[kind], x, a.iters))
                    runs["lopper_" + kind].append(lopper_ms(a.lopper, path, a.threads, a.iters))
                    if a.bf16:
                        runs["lopper_bf16_" + kind].append(
                            lopper_ms(a.lopper, path, a.threads, a.iters, "bf16"))
                    for peer, prec in (("openvino", "default"), ("openvino_f32", "f32")):
                        if openvino:
                            med, sp, ran, _ = openvino_peer.ms(openvino, path, x.shape, prec,
                                                               a.threads, 2, a.iters)
                            runs[f"{peer}_{kind}"].append((med, sp))
                            row[peer + "_precision"] = ran
            for k, v in runs.items():
                row[k + "_ms"] = statistics.median(m for m, _ in v)
                row[k + "_spread"] = max(sp for _, sp in v)
                row[k + "_rounds_ms"] = [round(m, 3) for m, _ in v]
            # Ratios: the median of the rounds' ratios (runs made side by side); lopper's best is
            # its faster precision round by round.
            def ratio(num, den):
                r = round_ratio(num, den)
                return None if r is None else round(r, 3)

            def times(k):
                return [m for m, _ in runs[k]]

            for k in ("dense", "pruned"):
                best = times("lopper_" + k)
                if a.bf16:
                    row[f"lopper_bf16_over_fp32_{k}"] = ratio(times(f"lopper_bf16_{k}"), best)
                    best = [min(x, y) for x, y in zip(best, times(f"lopper_bf16_{k}"))]
                row[f"lopper_over_ort_{k}"] = ratio(times("lopper_" + k), times("ort_" + k))
                if openvino:
                    row[f"lopper_over_openvino_f32_{k}"] = ratio(times("lopper_" + k),
                                                                 times(f"openvino_f32_{k}"))
                    row[f"lopper_best_over_openvino_{k}"] = ratio(best, times(f"openvino_{k}"))
            rows.append(row)
            sp = lambda k: max(row["ort_" + k + "_spread"], row["lopper_" + k + "_spread"])
            print(f"{stem:24s} params {row['params'] / row['params_before']:.3f}  MACs "
                  f"{row['macs'] / row['macs_before']:.3f}  ORT {row['ort_dense_ms']:.2f} -> "
                  f"{row['ort_pruned_ms']:.2f} ms  lopper {row['lopper_dense_ms']:.2f} -> "
                  f"{row['lopper_pruned_ms']:.2f} ms  lopper/ORT dense "
                  f"{row['lopper_over_ort_dense']:.2f} (spread {sp('dense'):.2f}) "
                  f"pruned {row['lopper_over_ort_pruned']:.2f} "
                  f"(spread {sp('pruned'):.2f})  prune {prune_s:.1f}s", flush=True)
            if openvino:
                print(f"{'':24s} OpenVINO ({row['openvino_precision']}) {row['openvino_dense_ms']:.2f} -> "
                      f"{row['openvino_pruned_ms']:.2f} ms, f32 {row['openvino_f32_dense_ms']:.2f} -> "
                      f"{row['openvino_f32_pruned_ms']:.2f} ms  lopper fp32 / OpenVINO f32 dense "
                      f"{row['lopper_over_openvino_f32_dense']:.2f} pruned "
                      f"{row['lopper_over_openvino_f32_pruned']:.2f}  lopper best / "
                      f"OpenVINO default dense {row['lopper_best_over_openvino_dense']:.2f} pruned "
                      f"{row['lopper_best_over_openvino_pruned']:.2f}"
                      + (f"  lopper bf16 {row['lopper_bf16_dense_ms']:.2f} -> "
                         f"{row['lopper_bf16_pruned_ms']:.2f} ms" if a.bf16 else ""), flush=True)
    if a.json:
        meta = dict(machine=f"{platform.machine()}, {os.cpu_count()} cores", cpu=cpu_model(),
                    batch=1, threads=a.threads, iters=a.iters, rounds=a.rounds, amount=a.amount,
                    onnxruntime=ort.__version__, **source)
        if openvino:
            meta["openvino"] = openvino_peer.version(openvino)
        with open(a.json + ".tmp", "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
