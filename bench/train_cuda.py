"""Fine-tuning throughput on a GPU: `lopper train --device cuda` against PyTorch's own training loop
on the same model, data and settings, in the same run.

Both sides: Fashion-MNIST's train split (60000 images, pixels / 255, [N,1,28,28]), batch 128,
shuffled each epoch, SGD with momentum 0.9 at lr 0.01, cross-entropy, BatchNorm in training mode;
the batches start on the CPU and are copied to the GPU one at a time through pinned memory without
blocking the host (what lopper's trainer does, and a DataLoader with pin_memory=True).
Each side runs --epochs epochs and the last epoch's samples per second is reported (the first pays
for cuDNN's and cuBLAS's warm-up). PyTorch's side is eager (no torch.compile), with autocast for
bf16. lopper's side reads the same architecture exported to ONNX with BatchNorm kept
(TrainingMode.PRESERVE), as examples/make_examples.py exports its models.

Models: examples' LeNet-5 (launch-bound: tiny layers), examples' ResNetFMNIST (16-32-64 wide,
one block per stage) and a wider one (64-128-256, two blocks per stage) that keeps the GPU busy.

Usage: bench/train_cuda.py --lopper build-gpu/lopper [--data-dir /usr/share/datasets/fashion-mnist]
       [--epochs 2] [--precisions fp32,bf16] [--models lenet5,resnet_fmnist,resnet_wide]
       [--json out.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import make_examples as ex  # noqa: E402
from accuracy_torch import load_split  # noqa: E402  (the one IDX reader of the benchmarks)

BATCH, LR = 128, 0.01


def models():
    return {
        "lenet5": ex.lenet5,
        "resnet_fmnist": lambda: ex.ResNetFMNIST(),
        "resnet_wide": lambda: ex.ResNetFMNIST(widths=(64, 128, 256), blocks=2),
    }


def export(module, path):
    torch.onnx.export(module.eval(), (torch.randn(1, 1, 28, 28),), path, dynamo=False,
                      opset_version=17, input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)


def torch_samples_per_s(module, x, y, epochs, precision):
    dev = torch.device("cuda")
    m = module.to(dev).train()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    rate = 0.0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in range(0, len(x), BATCH):
            idx = order[s:s + BATCH]
            xb = x[idx].pin_memory().to(dev, non_blocking=True)
            yb = y[idx].pin_memory().to(dev, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = loss_fn(m(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        loss.item()  # the epoch ends when its last step has run
        torch.cuda.synchronize()
        rate = len(x) / (time.perf_counter() - t0)
    return rate


def lopper_samples_per_s(lopper, model, data, epochs, precision, tmp):
    out = os.path.join(tmp, "trained.onnx")
    cmd = [lopper, "train", model, "-o", out, "--data", data, "--device", "cuda", "--precision",
           precision, "--epochs", str(epochs), "--lr", str(LR), "--batch-size", str(BATCH),
           "--no-eval"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-2000:]}")
    with open(out + ".train.json") as f:
        return float(json.load(f)["epochs"][-1]["samples_per_s"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lopper", required=True)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--models", default="lenet5,resnet_fmnist,resnet_wide")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("train_cuda.py: needs a CUDA GPU")
    x, y = load_split(a.data_dir, "train")
    data = "fashion-mnist" if a.data_dir == "/usr/share/datasets/fashion-mnist" else "idx:" + a.data_dir
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            torch.manual_seed(0)
            module = models()[name]()
            path = os.path.join(tmp, name + ".onnx")
            export(module, path)
            for p in a.precisions.split(","):
                ours = lopper_samples_per_s(a.lopper, path, data, a.epochs, p, tmp)
                torch.manual_seed(0)
                peer = torch_samples_per_s(models()[name](), x, y, a.epochs, p)
                rows.append(dict(model=name, precision=p, batch=BATCH, lopper_sps=ours,
                                 torch_sps=peer, ratio=ours / peer))
                print(f"{name} {p}: lopper {ours:.0f} samples/s, PyTorch eager {peer:.0f} "
                      f"samples/s, {ours / peer:.2f}x", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
