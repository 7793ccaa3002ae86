"""One-shot pruning with no fine-tuning on Fashion-MNIST: LeNet-300-100 pruned
90% in one step by magnitude, Wanda and SparseGPT with lopper, test top-1 of each beside the dense
model's: how much of the accuracy do SparseGPT's reconstruction and Wanda's activation-scaled
scores keep, against magnitude, when nothing is retrained afterwards?

Model: LeNet-300-100 (examples/make_examples.py: Flatten, 784-300-100-10 MLP with ReLU), from
examples/lenet300_100.onnx's initial weights, trained in PyTorch with bench/accuracy_torch.py's
recipe (SGD momentum 0.9, batch 128, cosine LR per epoch, 10 epochs at 0.05, pixels in [0, 1],
Debian's Fashion-MNIST), exported as the examples are (TorchScript exporter, opset 17, input
"image" [batch, 1, 28, 28], output "logits"; initializers keep their nn.Sequential names
"1.weight", ...). Cached in ~/.cache/lopper/oneshot-mnist/<key>/ ($LOPPER_CACHE), key = hash of
the recipe.

Pruning: `lopper prune dense.onnx --method l1|wanda|sparsegpt --amount 0.9` on every layer (local
scope: each of the three weights loses 90%); wanda and sparsegpt calibrate on 4 batches of 32
training images (`--data fashion-mnist --calib-batches 4 --batch-size 32`). Top-1: `lopper eval
OUT --data fashion-mnist --split test --json` (10,000 test images). Also measured: the prune
process's wall time and peak RSS (bench/llm_quality.py's run_measured).

Usage: .venv/bin/python bench/oneshot_mnist.py --lopper build/lopper [--methods l1,wanda,sparsegpt]
       [--amounts 0.9] [--threads 2] [--out results.json]
"""

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from llm_quality import last_line, run_measured  # noqa: E402
from results import save_json  # bench/results.py

CACHE = os.path.join(os.path.expanduser(os.environ.get("LOPPER_CACHE", "~/.cache/lopper")), "oneshot-mnist")
RECIPE = dict(model="lenet300_100", init="examples/lenet300_100.onnx", epochs=10, lr=0.05, momentum=0.9,
              batch=128, seed=0, schedule="cosine per epoch", version=1)
METHODS = ["l1", "wanda", "sparsegpt"]
CALIB = ["--data", "fashion-mnist", "--calib-batches", "4", "--batch-size", "32"]


def log(msg):
    print(f"[oneshot-mnist] {msg}", file=sys.stderr, flush=True)


def dense_model(threads):
    """The trained dense model's ONNX path (trained and exported on the first call) and its
    training record."""
    key = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:16]
    d = os.path.join(CACHE, key)
    path, meta = os.path.join(d, "lenet300_100.onnx"), os.path.join(d, "train.json")
    if os.path.exists(path) and os.path.exists(meta):
        with open(meta) as f:
            return path, json.load(f)

    import torch
    import torch.nn.functional as F

    import accuracy_torch as at  # the PyTorch peer's data loading and helpers

    torch.set_num_threads(threads)
    xtr, ytr = at.load_split(at.DATA_DIR, "train")
    xte, yte = at.load_split(at.DATA_DIR, "t10k")
    model = at.MODELS[RECIPE["model"]]()
    at.load_onnx_weights(model, os.path.join(ROOT, RECIPE["init"]))
    opt = torch.optim.SGD(model.parameters(), lr=RECIPE["lr"], momentum=RECIPE["momentum"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=RECIPE["epochs"])
    gen = torch.Generator().manual_seed(RECIPE["seed"])
    t0 = time.perf_counter()
    for _ in range(RECIPE["epochs"]):
        model.train()
        perm = torch.randperm(len(xtr), generator=gen)
        for i in range(0, len(xtr), RECIPE["batch"]):
            idx = perm[i:i + RECIPE["batch"]]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    seconds = time.perf_counter() - t0
    model.eval()
    top1 = at.evaluate(model, xte, yte)
    os.makedirs(d, exist_ok=True)
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # the TorchScript exporter, on purpose
    torch.onnx.export(model, (torch.randn(1, 1, 28, 28),), path + ".tmp", dynamo=False, opset_version=17,
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    os.replace(path + ".tmp", path)
    rec = dict(recipe=RECIPE, train_seconds=round(seconds, 1), torch_top1=top1)
    with open(meta, "w") as f:
        json.dump(rec, f, indent=1)
    log(f"trained {RECIPE['model']} in {seconds:.1f} s: PyTorch test top-1 {top1:.2f}%; {path}")
    return path, rec


def top1(lopper, path, threads):
    r = run_measured([lopper, "eval", path, "--data", "fashion-mnist", "--split", "test", "--json",
                      "--batch-size", "1000", "--threads", str(threads)])
    if r["rc"] != 0:
        sys.exit(f"[oneshot-mnist] lopper eval {path} failed: {last_line(r['stderr'])}")
    return 100 * json.loads(r["stdout"])["top1"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", default=os.path.join(ROOT, "build", "lopper"))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--amounts", default="0.9")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="", help="write the results here (JSON)")
    a = ap.parse_args()
    if not os.path.exists(a.lopper):
        sys.exit(f"[oneshot-mnist] {a.lopper}: no such program (make build)")
    dense, rec = dense_model(min(a.threads, 2))
    res = dict(model=RECIPE["model"], dense=dense, training=rec, dense_top1=top1(a.lopper, dense, a.threads),
               calibration=" ".join(CALIB), rows=[],
               env=dict(machine=platform.machine(), cpus=os.cpu_count(), python=platform.python_version()))
    work = tempfile.mkdtemp(prefix="lopper-oneshot-mnist-")
    try:
        for amount in [x for x in a.amounts.split(",") if x]:
            for method in [m for m in a.methods.split(",") if m]:
                out = os.path.join(work, f"{method}-{amount}.onnx")
                cmd = [a.lopper, "prune", dense, "-o", out, "--method", method, "--amount", amount,
                       "--threads", str(a.threads), "--json"] + (CALIB if method != "l1" else [])
                r = run_measured(cmd)
                row = dict(method=method, amount=amount, cmd=" ".join(cmd), wall_s=round(r["wall_s"], 2),
                           peak_rss_mb=round(r["peak_rss_mb"], 1))
                if r["rc"] != 0:
                    row["error"] = last_line(r["stderr"]) or last_line(r["stdout"])
                else:
                    row["sparsity"] = json.loads(r["stdout"])["sparsity"]
                    row["top1"] = top1(a.lopper, out, a.threads)
                log(f"{method} {amount}: " + (row.get("error") or f"top-1 {row['top1']:.2f}%, "
                                              f"sparsity {row['sparsity']:.3f}, {row['wall_s']:.2f} s"))
                res["rows"].append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = [f"LeNet-300-100 on Fashion-MNIST, one-shot, no fine-tuning; dense test top-1 "
             f"{res['dense_top1']:.2f}% (PyTorch: {rec['torch_top1']:.2f}%)", "",
             "| method | amount | sparsity | top-1 % | vs dense | prune s | peak RSS MB |",
             "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['amount']} | — | error | — | — | — |")
        else:
            lines.append(f"| {r['method']} | {r['amount']} | {r['sparsity']:.3f} | {r['top1']:.2f} | "
                         f"{r['top1'] - res['dense_top1']:+.2f} | {r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} |")
    lines += [f"{r['method']} {r['amount']}: {r['error']}" for r in res["rows"] if "error" in r]
    res["table"] = "\n".join(lines)
    print(res["table"])
    if a.out:
        save_json(a.out, res, indent=1)


if __name__ == "__main__":
    main()
