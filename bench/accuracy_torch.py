"""PyTorch peer of lopper's pruning pipelines on Fashion-MNIST: test top-1 accuracy and wall time.

bench/accuracy.py runs lopper's side in the same run; this script is the reference it is compared
with, so every choice below is spelled out for lopper to match.

Data: Debian's Fashion-MNIST (/usr/share/datasets/fashion-mnist, gzipped IDX), read with numpy;
pixels / 255 as float32, no mean/std normalisation (what torchvision's ToTensor gives), [N,1,28,28].
Model: examples/<model>.onnx's initializers are loaded by name ("1.weight", ...) into the same
nn.Sequential (examples/make_examples.py defines both), so torch and lopper start from identical
weights.

Training (every phase): SGD, momentum 0.9, no Nesterov, weight decay 0 (--weight-decay), batch 128,
cross-entropy, drop_last False; each epoch shuffles with torch.randperm on one torch.Generator
seeded with --seed (shared by all phases of a run). LR is cosine over the phase's E epochs, set per
epoch (torch's CosineAnnealingLR(T_max=E) stepped once per epoch, no warmup):
    lr_e = lr * (1 + cos(pi * e / E)) / 2,   e = 0 .. E-1
Prunable weights: every Linear and Conv2d weight (not biases). Pruning is global magnitude
(torch.nn.utils.prune.global_unstructured with L1Unstructured); masks are held during fine-tuning
by torch's forward pre-hooks (weight = weight_orig * weight_mask), then prune.remove.

Pipelines (--pipeline):
  dense   train --epochs.
  global  dense (or --dense-state), prune to --amount (0.92) at once, fine-tune --finetune-epochs
          at --finetune-lr.
  agp     dense (or --dense-state), then --finetune-epochs of fine-tuning with Zhu & Gupta's cubic
          ramp: at the start of each fine-tune epoch t in [--start-epoch, --end-epoch] (0-based;
          defaults 0 and finetune_epochs // 2), the global sparsity target is
          s_t = s_f + (s_i - s_f) * (1 - (t - t0) / n)^3 with s_i = 0, s_f = --amount,
          t0 = --start-epoch, n = --end-epoch - t0 (one step per epoch); masks are cumulative (each
          step prunes the remaining weights by 1 - (1 - s_t)/(1 - s_prev), done as an exact count
          so the total is round(s_t * N)); epochs after --end-epoch train with the final masks held.
  l1      train --epochs with loss + --l1 * sum(|w|) over the prunable weights, then global
          magnitude to --amount and fine-tune --finetune-epochs (no penalty). Here top1_dense is
          the L1-trained model's accuracy, and l1_frac_below gives the fraction of |w| under 1e-4,
          1e-3 and 1e-2 after it.

Per-model defaults (see DEFAULTS; each flag overrides):
  lenet300_100  --epochs 10 --lr 0.05 --finetune-epochs 5 --finetune-lr 0.05 --l1 1e-4
  lenet5        --epochs 8  --lr 0.02 --finetune-epochs 4 --finetune-lr 0.04 --l1 3e-4

Timing: wall_s = dense training + pruning + fine-tuning only. Data loading, model loading and the
per-epoch test evaluation (monitoring) are excluded; with --dense-state the dense phase is loaded,
not trained, and wall_dense_s is 0. Sparsity is measured on the final weights (exact zeros in the
prunable weights).

JSON (--json, written atomically): model, pipeline, top1_init, top1_dense, top1_pruned (global and
l1: right after pruning, before fine-tuning), top1, delta_vs_dense, sparsity, sparsity_per_layer,
wall_s, wall_dense_s, wall_prune_s, wall_finetune_s, config, history (one record per epoch), env.

Usage:
  .venv/bin/python bench/accuracy_torch.py --model lenet300_100 --pipeline global \
      [--epochs E] [--finetune-epochs F] [--lr LR] [--finetune-lr LR] [--amount 0.92] \
      [--seed 0] [--threads 2] [--save-dense D.pt | --dense-state D.pt] [--json OUT.json]
"""

import argparse
import gzip
import math
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.prune as prune

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import make_examples  # noqa: E402  (one definition of the example architectures)
from results import save_json  # bench/results.py

MODELS = {"lenet300_100": make_examples.lenet300_100, "lenet5": make_examples.lenet5}
# Per-model defaults, tuned on 2 CPU cores (seeds 0-2) so that global 92% + fine-tune stays within
# 0.3 points of dense. Fine-tuning after pruning 92% at once needs a real LR in a short budget:
# 0.01 over 5 epochs lost 0.4-0.9 points on the MLP; the values below lost at most 0.14.
# l1 is the smallest coefficient after which magnitude-pruning to 92% costs ~nothing.
DEFAULTS = {
    "lenet300_100": dict(lr=0.05, finetune_lr=0.05, epochs=10, finetune_epochs=5, l1=1e-4),
    "lenet5": dict(lr=0.02, finetune_lr=0.04, epochs=8, finetune_epochs=4, l1=3e-4),
}
DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        sys.exit(f"[data] {path}: not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != math.prod(dims):
        sys.exit(f"[data] {path}: expected {math.prod(dims)} values, found {data.size}")
    return data.reshape(dims)


def load_split(data_dir, prefix):
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return x, torch.from_numpy(y.astype(np.int64))


def load_onnx_weights(model, path):
    """Copies the ONNX file's initializers into model's parameters by name, checking shapes."""
    import onnx
    from onnx import numpy_helper

    inits = {t.name: t for t in onnx.load(path).graph.initializer}
    state = model.state_dict()
    for name, p in state.items():
        if name not in inits:
            sys.exit(f"[load] {path}: no initializer '{name}'")
        w = numpy_helper.to_array(inits[name])
        if tuple(w.shape) != tuple(p.shape):
            sys.exit(f"[load] {path}: '{name}' has shape {list(w.shape)}, model wants {list(p.shape)}")
        with torch.no_grad():
            p.copy_(torch.from_numpy(w.copy()))


def prunable(model):
    return [(m, "weight") for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


def effective_weight(module):
    """The weight the next forward will use (module.weight is only refreshed by forward)."""
    if hasattr(module, "weight_mask"):
        return module.weight_orig.detach() * module.weight_mask
    return module.weight.detach()


def sparsity(model):
    zeros = total = 0
    per_layer = {}
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            w = effective_weight(m)
            z = int((w == 0).sum())
            per_layer[name + ".weight"] = round(z / w.numel(), 6)
            zeros, total = zeros + z, total + w.numel()
    return zeros / total, per_layer


def prune_global_to(model, target):
    """Global magnitude pruning so that round(target * N) prunable weights are zero in total;
    already pruned weights stay pruned (cumulative masks)."""
    params = prunable(model)
    n_total = sum(effective_weight(m).numel() for m, _ in params)
    n_pruned = sum(int((m.weight_mask == 0).sum()) for m, _ in params if hasattr(m, "weight_mask"))
    k = round(target * n_total) - n_pruned
    if k <= 0:
        return
    # NOTE: an integer amount is the exact count of the *remaining* weights to remove (torch's
    # PruningContainer ranks only the unpruned entries), i.e. the fraction
    # 1 - (1 - s_t) / (1 - s_prev) without rounding drift between steps.
    scores = {(m, n): effective_weight(m) for m, n in params}
    prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=k,
                              importance_scores=scores)


def remove_masks(model):
    for m, n in prunable(model):
        if hasattr(m, n + "_mask"):
            prune.remove(m, n)


@torch.no_grad()
def evaluate(model, x, y, batch=1000):
    model.eval()
    correct = 0
    for i in range(0, len(x), batch):
        correct += int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    return 100.0 * correct / len(x)


def l1_penalty(model):
    return sum(
        (m.weight_orig * m.weight_mask if hasattr(m, "weight_mask") else m.weight).abs().sum()
        for m, _ in prunable(model))


class Runner:
    def __init__(self, args, data):
        self.a = args
        self.xtr, self.ytr, self.xte, self.yte = data
        self.gen = torch.Generator().manual_seed(args.seed)
        self.history = []

    def train(self, model, phase, epochs, lr, l1=0.0, before_epoch=None):
        """Trains `epochs` epochs; returns the seconds spent training (evaluation excluded)."""
        a = self.a
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=a.momentum, nesterov=False,
                              weight_decay=a.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1))
        spent = 0.0
        n = len(self.xtr)
        for e in range(epochs):
            t0 = time.perf_counter()
            if before_epoch is not None:
                before_epoch(e)
            model.train()
            perm = torch.randperm(n, generator=self.gen)
            loss_sum, correct = 0.0, 0
            for i in range(0, n, a.batch_size):
                idx = perm[i:i + a.batch_size]
                xb, yb = self.xtr[idx], self.ytr[idx]
                out = model(xb)
                loss = F.cross_entropy(out, yb)
                total = loss + l1 * l1_penalty(model) if l1 > 0 else loss
                opt.zero_grad(set_to_none=True)
                total.backward()
                opt.step()
                loss_sum += loss.item() * len(idx)
                correct += int((out.argmax(1) == yb).sum())
            lr_used = opt.param_groups[0]["lr"]
            sched.step()
            dt = time.perf_counter() - t0
            spent += dt
            test = evaluate(model, self.xte, self.yte) if a.eval_every_epoch else float("nan")
            sp, _ = sparsity(model)
            rec = dict(phase=phase, epoch=e + 1, epochs=epochs, lr=lr_used, loss=loss_sum / n,
                       train_top1=100.0 * correct / n, test_top1=test, sparsity=sp, seconds=dt)
            self.history.append(rec)
            print(f"[{phase}] epoch {e + 1}/{epochs} lr {lr_used:.5f} loss {rec['loss']:.4f} "
                  f"train {rec['train_top1']:.2f}% test {test:.2f}% sparsity {100 * sp:.2f}% "
                  f"{dt:.1f}s", flush=True)
        return spent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="lenet300_100")
    ap.add_argument("--pipeline", choices=["dense", "global", "agp", "l1"], default="global")
    ap.add_argument("--onnx", help="starting weights (default examples/<model>.onnx)")
    ap.add_argument("--data", default=DATA_DIR)
    ap.add_argument("--epochs", type=int, help="dense (or L1-regularised) epochs (10 MLP, 8 LeNet-5)")
    ap.add_argument("--finetune-epochs", type=int, help="(5 MLP, 4 LeNet-5)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, help="dense LR (0.05 MLP, 0.02 LeNet-5)")
    ap.add_argument("--finetune-lr", type=float, help="(0.05 MLP, 0.04 LeNet-5)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--amount", type=float, default=0.92, help="final global sparsity")
    ap.add_argument("--l1", type=float, help="L1 coefficient, pipeline l1 (1e-4 MLP, 3e-4 LeNet-5)")
    ap.add_argument("--start-epoch", type=int, default=0, help="agp: first pruning fine-tune epoch")
    ap.add_argument("--end-epoch", type=int,
                    help="agp: last pruning fine-tune epoch (default finetune-epochs // 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dense-state", help="load the dense model's state dict instead of training")
    ap.add_argument("--save-dense", help="save the dense model's state dict here")
    ap.add_argument("--no-eval-every-epoch", dest="eval_every_epoch", action="store_false",
                    help="skip the per-epoch test evaluation (progress lines show nan)")
    ap.add_argument("--json", help="write the result here (atomically)")
    a = ap.parse_args()
    for k, v in DEFAULTS[a.model].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.end_epoch is None:
        a.end_epoch = a.finetune_epochs // 2
    if not 0.0 <= a.amount < 1.0:
        ap.error(f"--amount must be in [0, 1), got {a.amount}")
    if a.pipeline == "agp" and not 0 <= a.start_epoch <= a.end_epoch < a.finetune_epochs:
        ap.error("agp needs 0 <= --start-epoch <= --end-epoch < --finetune-epochs")
    if a.dense_state and a.pipeline in ("dense", "l1"):
        ap.error("--dense-state is for the global and agp pipelines")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    data = load_split(a.data, "train") + load_split(a.data, "t10k")
    model = MODELS[a.model]()
    load_onnx_weights(model, a.onnx or os.path.join(ROOT, "examples", a.model + ".onnx"))
    r = Runner(a, data)
    res = dict(model=a.model, pipeline=a.pipeline)
    res["top1_init"] = evaluate(model, r.xte, r.yte)

    # Phase 1: dense (L1-regularised for the l1 pipeline).
    wall_dense = 0.0
    if a.dense_state:
        model.load_state_dict(torch.load(a.dense_state))
    else:
        wall_dense = r.train(model, "l1-train" if a.pipeline == "l1" else "dense", a.epochs, a.lr,
                             l1=a.l1 if a.pipeline == "l1" else 0.0)
        if a.save_dense:
            torch.save(model.state_dict(), a.save_dense + ".tmp")
            os.replace(a.save_dense + ".tmp", a.save_dense)
    res["top1_dense"] = evaluate(model, r.xte, r.yte)
    if a.pipeline == "l1":
        ws = torch.cat([effective_weight(m).flatten() for m, _ in prunable(model)]).abs()
        # How far the penalty got on its own: the fraction of |w| under each threshold.
        res["l1_frac_below"] = {t: float((ws < float(t)).float().mean())
                                for t in ("1e-4", "1e-3", "1e-2")}

    # Phase 2: prune + fine-tune.
    wall_prune = wall_ft = 0.0
    if a.pipeline in ("global", "l1"):
        t0 = time.perf_counter()
        prune_global_to(model, a.amount)
        wall_prune = time.perf_counter() - t0
        res["top1_pruned"] = evaluate(model, r.xte, r.yte)
        print(f"[prune] global magnitude {100 * a.amount:.1f}%: test {res['top1_pruned']:.2f}% "
              f"(dense {res['top1_dense']:.2f}%) {wall_prune:.3f}s", flush=True)
        wall_ft = r.train(model, "finetune", a.finetune_epochs, a.finetune_lr)
    elif a.pipeline == "agp":
        t0_, n = a.start_epoch, a.end_epoch - a.start_epoch
        prune_time = [0.0]

        def agp_step(e):
            if not t0_ <= e <= a.end_epoch:
                return
            s = a.amount if n == 0 else a.amount * (1.0 - (1.0 - (e - t0_) / n) ** 3)
            t = time.perf_counter()
            prune_global_to(model, s)
            prune_time[0] += time.perf_counter() - t

        wall_ft = r.train(model, "agp", a.finetune_epochs, a.finetune_lr, before_epoch=agp_step)
        # Prune time is part of each epoch's time; report it apart without counting it twice.
        wall_prune = prune_time[0]
        wall_ft -= wall_prune
    t0 = time.perf_counter()
    remove_masks(model)
    wall_prune += time.perf_counter() - t0

    res["top1"] = evaluate(model, r.xte, r.yte)
    res["sparsity"], res["sparsity_per_layer"] = sparsity(model)
    res["delta_vs_dense"] = res["top1"] - res["top1_dense"]
    res.update(wall_s=wall_dense + wall_prune + wall_ft, wall_dense_s=wall_dense,
               wall_prune_s=wall_prune, wall_finetune_s=wall_ft,
               wall_note="train + prune + fine-tune only; excludes data/model loading and "
                         "per-epoch test evaluation")
    res["dense_loaded"] = bool(a.dense_state)
    res["config"] = {k: v for k, v in vars(a).items() if k not in ("json",)}
    res["history"] = r.history
    res["env"] = dict(torch=torch.__version__, threads=torch.get_num_threads(),
                      machine=platform.machine(), python=platform.python_version())
    print(f"[result] {a.model} {a.pipeline}: top1 {res['top1']:.2f}% (dense {res['top1_dense']:.2f}%, "
          f"delta {res['delta_vs_dense']:+.2f}) sparsity {100 * res['sparsity']:.2f}% "
          f"wall {res['wall_s']:.1f}s", flush=True)
    if a.json:
        save_json(a.json, res, indent=1)
    return res


if __name__ == "__main__":
    main()
