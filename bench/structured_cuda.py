"""Structured pruning on the GPU: a model pruned with `lopper prune --structured channel` until
about half its MACs are gone (the amount is found by bisection on the pruned model's MAC count),
then the dense and the pruned model timed with `lopper bench --device cuda` at one batch size, in
each precision, in the same run. PyTorch eager on the same torchvision model is the peer for the
dense time (so a slow lopper dense baseline cannot flatter the ratio).

The model is torchvision's (random weights: speed only), exported with a dynamic batch.

Usage: bench/structured_cuda.py --lopper build-gpu/lopper [--model resnet50] [--macs 0.5]
       [--batch 64] [--precisions fp32,bf16] [--iters 30] [--json out.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def prune_to_macs(lopper, model, target, out, round_to):
    """Bisects --amount until the pruned model keeps `target` of the MACs (within 1%)."""
    lo, hi, best = 0.0, 0.9, None
    for _ in range(12):
        amount = (lo + hi) / 2
        j = run([lopper, "prune", model, "-o", out, "--structured", "channel", "--amount",
                 f"{amount:.4f}", "--round-to", str(round_to), "--json"])
        kept = j["macs"] / j["macs_before"]
        best = dict(amount=amount, macs=j["macs"], macs_before=j["macs_before"],
                    params=j["params"], params_before=j["params_before"], macs_kept=kept)
        print(f"  amount {amount:.4f}: MACs kept {kept:.3f}", flush=True)
        if abs(kept - target) < 0.01:
            break
        lo, hi = (amount, hi) if kept > target else (lo, amount)
    return best


def lopper_ms(lopper, model, batch, precision, iters, cudnn_find=True):
    """lopper's median; cudnn_find=False: without cuDNN's algorithm search (its heuristics alone),
    in a kernel cache of its own so that no choice timed with the search is reused."""
    env = None
    if not cudnn_find:
        env = dict(os.environ, LOPPER_CUDNN_BENCHMARK="0",
                   LOPPER_CACHE_DIR=os.path.join(tempfile.gettempdir(), "lopper-cache-no-find"))
    j = run([lopper, "bench", model, "--device", "cuda", "--batch", str(batch), "--precision",
             precision, "--iters", str(iters), "--warmup", "5", "--json"], env)
    return float(j["median_ms"])


def export(name, path):
    import torch
    import torchvision

    m = getattr(torchvision.models, name)().eval()
    torch.onnx.export(m, (torch.randn(1, 3, 224, 224),), path, dynamo=False, input_names=["input"],
                      dynamic_axes={"input": {0: "batch"}}, opset_version=17)


def torch_ms(name, batch, precision, iters, cudnn_benchmark=False):
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = cudnn_benchmark

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    m = getattr(torchvision.models, name)().eval().cuda().to(dtype)
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=dtype)
    times = []
    with torch.inference_mode():
        for _ in range(5):
            m(x)
        torch.cuda.synchronize()
        for _ in range(iters):
            t0 = time.perf_counter()
            m(x)
            torch.cuda.synchronize()
            times.append(1000 * (time.perf_counter() - t0))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", required=True)
    ap.add_argument("--model", default="resnet50", help="a torchvision model")
    ap.add_argument("--macs", type=float, default=0.5, help="share of the MACs to keep")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--round-to", type=int, default=8, help="channel counts a multiple of N")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--profile-dir", help="also write, per model and precision, `lopper bench "
                    "--profile --explain` at the batch and the median at twice the batch (does the "
                    "time follow the work, or the host's launches?)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dense, pruned = os.path.join(tmp, "dense.onnx"), os.path.join(tmp, "pruned.onnx")
        export(a.model, dense)
        print(f"pruning {a.model} to {a.macs:.0%} of its MACs", flush=True)
        p = prune_to_macs(a.lopper, dense, a.macs, pruned, a.round_to)
        for prec in a.precisions.split(","):
            row = dict(p, model=a.model, batch=a.batch, precision=prec)
            row["dense_ms"] = lopper_ms(a.lopper, dense, a.batch, prec, a.iters)
            row["pruned_ms"] = lopper_ms(a.lopper, pruned, a.batch, prec, a.iters)
            row["speedup"] = row["dense_ms"] / row["pruned_ms"]
            row["torch_dense_ms"] = torch_ms(a.model, a.batch, prec, a.iters)
            # The peer at its best too: cuDNN's algorithm search, as lopper does per layer.
            row["torch_dense_ms_benchmark"] = torch_ms(a.model, a.batch, prec, a.iters, True)
            row["dense_ms_no_find"] = lopper_ms(a.lopper, dense, a.batch, prec, a.iters, False)
            row["pruned_ms_no_find"] = lopper_ms(a.lopper, pruned, a.batch, prec, a.iters, False)
            if a.profile_dir:
                os.makedirs(a.profile_dir, exist_ok=True)
                for tag, path in (("dense", dense), ("pruned", pruned)):
                    cmd = [a.lopper, "bench", path, "--device", "cuda", "--batch", str(a.batch),
                           "--precision", prec, "--iters", str(a.iters), "--warmup", "5",
                           "--profile", "--explain"]
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    with open(os.path.join(a.profile_dir, f"{tag}-{prec}.txt"), "w") as f:
                        f.write(r.stdout + r.stderr)
                    row[f"{tag}_ms_2x_batch"] = lopper_ms(a.lopper, path, 2 * a.batch, prec, a.iters)
            rows.append(row)
            print(f"{row['model']} {prec} batch {a.batch}: MACs kept {p['macs_kept']:.3f}, "
                  f"lopper dense {row['dense_ms']:.2f} ms, pruned {row['pruned_ms']:.2f} ms "
                  f"({row['speedup']:.2f}x), torch eager dense {row['torch_dense_ms']:.2f} ms "
                  f"({row['torch_dense_ms_benchmark']:.2f} with cudnn.benchmark); lopper without "
                  f"cuDNN's search: dense {row['dense_ms_no_find']:.2f}, pruned "
                  f"{row['pruned_ms_no_find']:.2f} ms",
                  flush=True)
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
