"""Pruned accuracy on real data, lopper vs PyTorch in the same run: LeNet-300-100 and LeNet-5 on
Fashion-MNIST, each pruned to 92% by three pipelines.

Both sides start from the same weights (examples/<model>.onnx) and use the same recipe (SGD momentum
0.9, batch 128, cosine LR per epoch, cross-entropy, pixels in [0, 1]); bench/accuracy_torch.py is
the PyTorch side (torch.nn.utils.prune, documented there). Per model:
  dense   train --epochs at --lr                                   (shared by global and agp)
  global  global magnitude pruning to 92% at once, fine-tune --finetune-epochs at 0.01
  agp     fine-tune the dense model --finetune-epochs with Zhu & Gupta's cubic ramp to 92% over
          fine-tune epochs 0 .. F//2 (pruned at the start of each), masks held after
  l1      train --epochs with loss + λ·Σ|w| (joint training), then global 92% + fine-tune
lopper runs `lopper train` / `lopper prune` / `lopper eval`. Time is training + pruning only on both
sides (lopper: the epochs' own seconds from OUT.train.json plus the prune process; PyTorch: its
wall_s), so neither side's data loading or test evaluation counts. Accuracy: test top-1.

Usage: bench/accuracy.py --lopper build/lopper [--models lenet300_100,lenet5] [--epochs 10]
       [--finetune-epochs 6] [--threads 2] [--json docs/bench-accuracy.json]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LR = {"lenet300_100": 0.05, "lenet5": 0.02}
L1 = {"lenet300_100": 1e-5, "lenet5": 1e-5}
AMOUNT = 0.92


def sh(cmd, **kw):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return r, time.perf_counter() - t0


def lopper_train(a, src, out, epochs, lr, extra=()):
    cmd = [a.lopper, "train", src, "--data", "fashion-mnist", "-o", out, "--epochs", str(epochs), "--lr", str(lr),
           "--lr-schedule", "cosine", "--momentum", "0.9", "--batch-size", "128", "--seed", str(a.seed),
           "--threads", str(a.threads), "--no-eval", *extra]
    _, wall = sh(cmd)
    with open(out + ".train.json") as f:
        j = json.load(f)
    return sum(e["seconds"] for e in j["epochs"]), wall


def lopper_top1(a, path):
    r, _ = sh([a.lopper, "eval", path, "--data", "fashion-mnist", "--json", "--batch-size", "1000"])
    return 100 * json.loads(r.stdout)["top1"]


def lopper_prune(a, src, out):
    r, wall = sh([a.lopper, "prune", src, "-o", out, "--method", "l1", "--scope", "global", "--amount",
                  str(AMOUNT), "--json"])
    return wall, json.loads(r.stdout)["sparsity"]


def lopper_side(a, model, tmp):
    src = os.path.join(ROOT, "examples", model + ".onnx")
    F = a.finetune_epochs
    res = {}
    dense = os.path.join(tmp, f"{model}.dense.onnx")
    t_dense, _ = lopper_train(a, src, dense, a.epochs, LR[model])
    top1_dense = lopper_top1(a, dense)
    # global: prune at once, fine-tune with the zeros held.
    pruned = os.path.join(tmp, f"{model}.global.pruned.onnx")
    t_prune, _ = lopper_prune(a, dense, pruned)
    out = os.path.join(tmp, f"{model}.global.onnx")
    t_ft, _ = lopper_train(a, pruned, out, F, 0.01)
    res["global"] = dict(top1=lopper_top1(a, out), top1_dense=top1_dense, wall_s=t_dense + t_prune + t_ft,
                         sparsity=sparsity(a, out))
    # agp: ramp while fine-tuning.
    out = os.path.join(tmp, f"{model}.agp.onnx")
    t_ft, _ = lopper_train(a, dense, out, F, 0.01, ["--schedule", "agp", "--prune-method", "l1", "--prune-amount",
                                                    str(AMOUNT), "--start-epoch", "0", "--end-epoch", str(F // 2)])
    res["agp"] = dict(top1=lopper_top1(a, out), top1_dense=top1_dense, wall_s=t_dense + t_ft, sparsity=sparsity(a, out))
    # l1: joint training, then prune + fine-tune.
    reg = os.path.join(tmp, f"{model}.l1.dense.onnx")
    t_reg, _ = lopper_train(a, src, reg, a.epochs, LR[model], ["--l1", str(L1[model])])
    pruned = os.path.join(tmp, f"{model}.l1.pruned.onnx")
    t_prune, _ = lopper_prune(a, reg, pruned)
    out = os.path.join(tmp, f"{model}.l1.onnx")
    t_ft, _ = lopper_train(a, pruned, out, F, 0.01)
    res["l1"] = dict(top1=lopper_top1(a, out), top1_dense=lopper_top1(a, reg), wall_s=t_reg + t_prune + t_ft,
                     sparsity=sparsity(a, out))
    return res, top1_dense


def sparsity(a, path):
    r, _ = sh([a.lopper, "inspect", path, "--json"])
    j = json.loads(r.stdout)
    p = sum(l["params"] for l in j["layers"])
    nz = sum(l["nonzero"] for l in j["layers"])
    return 1 - nz / p


def torch_side(a, model, tmp):
    base = [sys.executable, os.path.join(HERE, "accuracy_torch.py"), "--model", model, "--epochs", str(a.epochs),
            "--finetune-epochs", str(a.finetune_epochs), "--amount", str(AMOUNT), "--seed", str(a.seed),
            "--threads", str(a.threads), "--lr", str(LR[model]), "--finetune-lr", "0.01", "--l1", str(L1[model]),
            "--end-epoch", str(a.finetune_epochs // 2), "--no-eval-every-epoch"]
    state = os.path.join(tmp, f"{model}.dense.pt")
    out = {}

    def run(pipeline, *extra):
        path = os.path.join(tmp, f"{model}.{pipeline}.torch.json")
        sh(base + ["--pipeline", pipeline, "--json", path, *extra])
        with open(path) as f:
            return json.load(f)

    dense = run("dense", "--save-dense", state)
    for p in ("global", "agp"):
        r = run(p, "--dense-state", state)
        r["wall_s"] += dense["wall_s"]  # the dense phase was loaded, not trained, in this run
        out[p] = r
    out["l1"] = run("l1")
    return out, dense["top1"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lopper", required=True)
    ap.add_argument("--models", default="lenet300_100,lenet5")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--finetune-epochs", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            print(f"[{model}] lopper ...", flush=True)
            lop, lop_dense = lopper_side(a, model, tmp)
            print(f"[{model}] torch ...", flush=True)
            tor, tor_dense = torch_side(a, model, tmp)
            results[model] = dict(lopper=lop, torch=tor, lopper_dense=lop_dense, torch_dense=tor_dense)
            for p in ("global", "agp", "l1"):
                rows.append((model, p, lop[p], tor[p], lop_dense, tor_dense))
    print(f"\nFashion-MNIST test top-1 (%), {int(AMOUNT * 100)}% of the weights pruned, "
          f"{a.epochs} dense + {a.finetune_epochs} fine-tune epochs, {a.threads} threads")
    print(f"{'model':14s} {'pipeline':8s} {'dense':>14s} {'pruned lopper':>14s} {'pruned torch':>13s} "
          f"{'lopper-torch':>13s} {'lopper-dense':>13s} {'time lopper/torch':>18s}")
    for model, p, l, t, ld, td in rows:
        print(f"{model:14s} {p:8s} {ld:6.2f}/{td:6.2f} {l['top1']:14.2f} {t['top1']:13.2f} "
              f"{l['top1'] - t['top1']:+13.2f} {l['top1'] - ld:+13.2f} "
              f"{l['wall_s']:7.1f}s/{t['wall_s']:5.1f}s={l['wall_s'] / t['wall_s']:.2f}")
    if a.json:
        meta = dict(machine=f"{platform.machine()}, {os.cpu_count()} cores", epochs=a.epochs,
                    finetune_epochs=a.finetune_epochs, threads=a.threads, amount=AMOUNT, seed=a.seed)
        with open(a.json + ".tmp", "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
