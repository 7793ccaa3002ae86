"""lopper vs ONNX Runtime vs PyTorch eager: the same models, the same machine, the same run.

Each model is exported once (TorchScript exporter, dynamic batch); ONNX Runtime runs it in-process
(intra-op threads = T, inter-op 1, all graph optimizations), PyTorch eager runs the nn.Module under
inference_mode with T threads, lopper runs `lopper bench --json` on the same .onnx file. The table
is median latency (ms) and lopper's ratio to ONNX Runtime (lower is better; the target is <= 1.0);
the spread (p90 / median, the worst round of ONNX Runtime and lopper) is printed beside each ratio.
lopper runs at fp32 and, with --bf16, at `--precision bf16` too. OpenVINO, where its venv exists
(scripts/install-openvino.sh), runs the same file in its own process (bench/openvino_runner.py) at
its default precision (bf16 on a CPU with bf16 arithmetic: AMX or AVX512_BF16) and at f32; the
runtimes take turns in every round.

Usage: bench/compare_runtimes.py --lopper build/lopper [--threads 2] [--batches 1,32] [--rounds 3]
       [--models resnet18,resnet50,mobilenet_v2,densenet121,efficientnet_b0,vit_b_16,bert_encoder]
       [--bf16]
       [--openvino .venv-openvino/bin/python | none] [--out docs/bench-runtimes.json]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

import numpy as np
import onnxruntime as ort
import torch
import torch.nn as nn
import torchvision

import openvino_peer  # bench/openvino_peer.py
from results import cpu_model, git_rev  # bench/results.py
from timing import median_spread, round_ratio, times_ms  # bench/timing.py


def bert_encoder():
    """A 4-layer BERT-base-sized encoder: d_model 768, 12 heads, FFN 3072, GELU, sequence 128."""
    layer = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), (128, 768)


MODELS = {
    "resnet18": lambda: (torchvision.models.resnet18(), (3, 224, 224)),
    "resnet50": lambda: (torchvision.models.resnet50(), (3, 224, 224)),
    "mobilenet_v2": lambda: (torchvision.models.mobilenet_v2(), (3, 224, 224)),
    "densenet121": lambda: (torchvision.models.densenet121(), (3, 224, 224)),
    "efficientnet_b0": lambda: (torchvision.models.efficientnet_b0(), (3, 224, 224)),
    "vit_b_16": lambda: (torchvision.models.vit_b_16(), (3, 224, 224)),
    "bert_encoder": bert_encoder,
}


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lopper_ms(args, path, batch, warmup, iters, precision):
    out = subprocess.run(
        [args.lopper, "bench", path, "--batch", str(batch), "--threads", str(args.threads), "--warmup",
         str(warmup), "--iters", str(iters), "--precision", precision, "--json"],
        capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    return j["median_ms"], j["spread"]


def iters_for(batch):
    return (3, 20) if batch <= 4 else (1, 5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lopper", default="build/lopper")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="lopper at --precision bf16 too")
    ap.add_argument("--openvino", default=openvino_peer.DEFAULT_PYTHON,
                    help="the python of OpenVINO's venv (scripts/install-openvino.sh); none: skip it")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    source = {"git": git_rev(), "date": time.strftime("%Y-%m-%d")}  # what is measured
    openvino, why = openvino_peer.resolve(args.openvino)
    if openvino is None:
        print(f"OpenVINO {why}", file=sys.stderr)
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    tmp = tempfile.mkdtemp(prefix="lopper_bench_")
    # lopper's kernel choices are timed in this run (its first bench of each model and batch), not
    # taken from a cache that another build of lopper filled.
    os.environ["LOPPER_CACHE_DIR"] = os.path.join(tmp, "cache")
    for name in args.models.split(","):
        torch.manual_seed(0)
        model, shape = MODELS[name]()
        model.eval()
        path = os.path.join(tmp, name + ".onnx")
        torch.onnx.export(model, (torch.randn(1, *shape),), path, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        for batch in batches:
            warmup, iters = iters_for(batch)
            x = torch.randn(batch, *shape)
            xn = x.numpy()
            # NOTE: the three runtimes take turns, round after round, and each reports the median
            # of its round medians: a slow spell of the machine then hits all three alike.
            # Each entry: (median ms, spread = p90 / median) of one round.
            ort_r, torch_r, lopper_r, bf16_r, ov_r, ov32_r = [], [], [], [], [], []
            ov_info = {}
            for _ in range(args.rounds):
                ort_r.append(median_spread(times_ms(lambda: sess.run(None, {"x": xn}), warmup,
                                                    iters)))
                with torch.inference_mode():
                    torch_r.append(median_spread(times_ms(lambda: model(x), warmup, iters)))
                lopper_r.append(lopper_ms(args, path, batch, warmup, iters, "fp32"))
                if args.bf16:
                    bf16_r.append(lopper_ms(args, path, batch, warmup, iters, "bf16"))
                if openvino:
                    for prec, r in (("default", ov_r), ("f32", ov32_r)):
                        med, sp, ran, version = openvino_peer.ms(openvino, path, (batch, *shape), prec,
                                                            args.threads, warmup, iters)
                        r.append((med, sp))
                        ov_info[prec] = ran
                        ov_info["version"] = version
            t_ort, t_torch, t_lopper = (statistics.median(m for m, _ in r)
                                        for r in (ort_r, torch_r, lopper_r))

            def ratio(num, den):  # the median of the rounds' ratios (runs made side by side)
                return round_ratio([m for m, _ in num], [m for m, _ in den])

            spread = max(sp for r in (ort_r, lopper_r) for _, sp in r)
            row = {"model": name, "batch": batch, "lopper_ms": round(t_lopper, 2),
                   "ort_ms": round(t_ort, 2), "torch_ms": round(t_torch, 2),
                   "lopper_over_ort": round(ratio(lopper_r, ort_r), 3), "spread": round(spread, 2)}
            line = (f"{name:14s} batch {batch:3d}  lopper {t_lopper:9.2f} ms  onnxruntime {t_ort:9.2f} ms"
                    f"  torch {t_torch:9.2f} ms  lopper/ort {row['lopper_over_ort']:5.2f} (spread {spread:.2f})")
            if bf16_r:
                t = statistics.median(m for m, _ in bf16_r)
                row.update(lopper_bf16_ms=round(t, 2),
                           lopper_bf16_over_fp32=round(ratio(bf16_r, lopper_r), 3))
                line += f"  lopper bf16 {t:.2f} ms"
            if ov_r:
                t_ov, t_ov32 = (statistics.median(m for m, _ in r) for r in (ov_r, ov32_r))
                row.update(openvino_ms=round(t_ov, 2), openvino_precision=ov_info["default"],
                           openvino_f32_ms=round(t_ov32, 2),
                           lopper_over_openvino_f32=round(ratio(lopper_r, ov32_r), 3))
                # lopper's faster precision, round by round
                best_r = [min(a, b) for a, b in zip(lopper_r, bf16_r)] if bf16_r else lopper_r
                row["lopper_best_over_openvino"] = round(ratio(best_r, ov_r), 3)
                line += (f"  openvino {t_ov:.2f} ms ({ov_info['default']})  openvino f32 {t_ov32:.2f} ms"
                         f"  lopper best/openvino {row['lopper_best_over_openvino']:.2f}")
            rows.append(row)
            print(line, flush=True)
    meta = {"machine": platform.processor() or platform.machine(), "cpu": cpu_model(),
            "cores": os.cpu_count(), "threads": args.threads, "onnxruntime": ort.__version__,
            "torch": torch.__version__, **source}
    if openvino:
        meta["openvino"] = openvino_peer.version(openvino)
    print("\n| model | batch | lopper ms | ONNX Runtime ms | PyTorch eager ms | lopper / ORT (spread) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['lopper_ms']} | {r['ort_ms']} | {r['torch_ms']} |"
              f" {r['lopper_over_ort']} ({r['spread']}) |")
    if any("openvino_ms" in r or "lopper_bf16_ms" in r for r in rows):
        print("\n| model | batch | lopper fp32 ms | lopper bf16 ms | OpenVINO default ms (precision) |"
              " OpenVINO f32 ms | lopper fp32 / OpenVINO f32 | lopper best / OpenVINO default |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {r['batch']} | {r['lopper_ms']} | {r.get('lopper_bf16_ms', '—')} |"
                  f" {r.get('openvino_ms', '—')} ({r.get('openvino_precision', '—')}) |"
                  f" {r.get('openvino_f32_ms', '—')} | {r.get('lopper_over_openvino_f32', '—')} |"
                  f" {r.get('lopper_best_over_openvino', '—')} |")
    print(f"\n{meta}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
