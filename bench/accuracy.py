"""Pruned accuracy on real data, lopper vs PyTorch in the same run: LeNet-300-100 and LeNet-5 on
Fashion-MNIST, each pruned to 92% by three pipelines.

Both sides start from the same weights (examples/<model>.onnx) and use the same recipe (SGD momentum
0.9, batch 128, cosine LR per epoch, cross-entropy, pixels in [0, 1]); bench/accuracy_torch.py is
the PyTorch side (torch.nn.utils.prune, documented there). Per model:
  dense   train E epochs at the dense LR                           (shared by global and agp)
  global  global magnitude pruning to 92% at once, fine-tune F epochs at the fine-tune LR
  agp     fine-tune the dense model F epochs with Zhu & Gupta's cubic ramp to 92% over fine-tune
          epochs 0 .. F//2 (pruned at the start of each), masks held after
  l1      train E epochs with loss + λ·Σ|w| (joint training), then global 92% + fine-tune
(E, F, the LRs and λ per model: CONFIG below.)
lopper runs `lopper train` / `lopper prune` / `lopper eval`. Time is training + pruning only on both
sides (lopper: the epochs' own seconds from OUT.train.json plus the prune process; PyTorch: its
wall_s), so neither side's data loading or test evaluation counts. Accuracy: test top-1.

Usage: bench/accuracy.py --lopper build/lopper [--models lenet300_100,lenet5] [--seeds 0,1]
       [--threads 2] [--json docs/bench-accuracy.json]
"""

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from options import seeds_parser  # bench/options.py
from results import mean, save_json  # bench/results.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Per model: dense epochs, dense LR, fine-tune epochs, fine-tune LR, L1 strength — the defaults
# bench/accuracy_torch.py settled on (its docstring says why).
CONFIG = {
    "lenet300_100": dict(epochs=10, lr=0.05, ft_epochs=5, ft_lr=0.05, l1=1e-4),
    "lenet5": dict(epochs=8, lr=0.02, ft_epochs=8, ft_lr=0.04, l1=3e-4),
}
AMOUNT = 0.92


def sh(cmd, **kw):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return r, time.perf_counter() - t0


def lopper_train(a, src, out, epochs, lr, extra=()):
    cmd = [a.lopper, "train", src, "--data", "fashion-mnist", "-o", out, "--epochs", str(epochs), "--lr", str(lr),
           "--lr-schedule", "cosine", "--momentum", "0.9", "--batch-size", "128", "--seed", str(a.seed_now),
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
    c = CONFIG[model]
    src = os.path.join(ROOT, "examples", model + ".onnx")
    F = c["ft_epochs"]
    res = {}
    dense = os.path.join(tmp, f"{model}.dense.onnx")
    t_dense, _ = lopper_train(a, src, dense, c["epochs"], c["lr"])
    top1_dense = lopper_top1(a, dense)
    # global: prune at once, fine-tune with the zeros held.
    pruned = os.path.join(tmp, f"{model}.global.pruned.onnx")
    t_prune, _ = lopper_prune(a, dense, pruned)
    out = os.path.join(tmp, f"{model}.global.onnx")
    t_ft, _ = lopper_train(a, pruned, out, F, c["ft_lr"])
    res["global"] = dict(top1=lopper_top1(a, out), top1_dense=top1_dense, wall_s=t_dense + t_prune + t_ft,
                         sparsity=sparsity(a, out))
    # agp: ramp while fine-tuning, pruned at the start of fine-tune epochs 0 .. F//2.
    out = os.path.join(tmp, f"{model}.agp.onnx")
    t_ft, _ = lopper_train(a, dense, out, F, c["ft_lr"], ["--schedule", "agp", "--prune-method", "l1",
                                                          "--prune-amount", str(AMOUNT), "--start-epoch", "0",
                                                          "--end-epoch", str(F // 2)])
    res["agp"] = dict(top1=lopper_top1(a, out), top1_dense=top1_dense, wall_s=t_dense + t_ft, sparsity=sparsity(a, out))
    # l1: joint training, then prune + fine-tune.
    reg = os.path.join(tmp, f"{model}.l1.dense.onnx")
    t_reg, _ = lopper_train(a, src, reg, c["epochs"], c["lr"], ["--l1", str(c["l1"])])
    pruned = os.path.join(tmp, f"{model}.l1.pruned.onnx")
    t_prune, _ = lopper_prune(a, reg, pruned)
    out = os.path.join(tmp, f"{model}.l1.onnx")
    t_ft, _ = lopper_train(a, pruned, out, F, c["ft_lr"])
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
    c = CONFIG[model]
    base = [sys.executable, os.path.join(HERE, "accuracy_torch.py"), "--model", model, "--epochs", str(c["epochs"]),
            "--finetune-epochs", str(c["ft_epochs"]), "--amount", str(AMOUNT), "--seed", str(a.seed_now),
            "--threads", str(a.threads), "--lr", str(c["lr"]), "--finetune-lr", str(c["ft_lr"]), "--l1", str(c["l1"]),
            "--start-epoch", "0", "--end-epoch", str(c["ft_epochs"] // 2), "--no-eval-every-epoch"]
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
    ap = seeds_parser(__doc__, "lenet300_100,lenet5", "each pipeline runs once per seed; the table has the means")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            results[model] = []
            for seed in seeds:
                a.seed_now = seed
                print(f"[{model} seed {seed}] lopper ...", flush=True)
                lop, lop_dense = lopper_side(a, model, tmp)
                print(f"[{model} seed {seed}] torch ...", flush=True)
                tor, tor_dense = torch_side(a, model, tmp)
                results[model].append(dict(seed=seed, lopper=lop, torch=tor, lopper_dense=lop_dense,
                                           torch_dense=tor_dense))
                for p in ("global", "agp", "l1"):
                    print(f"  {p:6s} lopper {lop[p]['top1']:.2f}% ({lop[p]['wall_s']:.1f}s)  "
                          f"torch {tor[p]['top1']:.2f}% ({tor[p]['wall_s']:.1f}s)", flush=True)
    print(f"\nFashion-MNIST test top-1 (%), {int(AMOUNT * 100)}% of the weights pruned, mean of seeds {a.seeds}, "
          f"{a.threads} threads")
    print(f"{'model':14s} {'pipeline':8s} {'dense l/t':>13s} {'pruned lopper':>14s} {'pruned torch':>13s} "
          f"{'lopper-torch':>13s} {'lopper-dense':>13s} {'time lopper/torch':>22s}")
    summary = {}
    for model, runs in results.items():
        ld = mean([r["lopper_dense"] for r in runs])
        td = mean([r["torch_dense"] for r in runs])
        for p in ("global", "agp", "l1"):
            l = mean([r["lopper"][p]["top1"] for r in runs])
            t = mean([r["torch"][p]["top1"] for r in runs])
            lw = mean([r["lopper"][p]["wall_s"] for r in runs])
            tw = mean([r["torch"][p]["wall_s"] for r in runs])
            summary[f"{model}/{p}"] = dict(lopper_top1=l, torch_top1=t, lopper_dense=ld, torch_dense=td,
                                           lopper_wall_s=lw, torch_wall_s=tw)
            print(f"{model:14s} {p:8s} {ld:6.2f}/{td:6.2f} {l:14.2f} {t:13.2f} {l - t:+13.2f} {l - ld:+13.2f} "
                  f"{lw:7.1f}s/{tw:6.1f}s = {lw / tw:.2f}")
    if a.json:
        meta = dict(machine=f"{platform.machine()}, {os.cpu_count()} cores", seeds=seeds, threads=a.threads,
                    amount=AMOUNT, config=CONFIG)
        save_json(a.json, dict(meta=meta, summary=summary, runs=results), indent=1)


if __name__ == "__main__":
    main()
