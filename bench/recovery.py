"""Recovery after pruning: distillation from the dense model (Minitron's recipe: prune, then train
the pruned model on the dense model's logits) against plain fine-tuning on the task loss, with the
same epochs, learning rate, schedule and batches; and lopper's trainer against a plain PyTorch
loop doing the same recovery of the same pruned weights.

Part A, vision (`--part vision`): Fashion-MNIST (60k train / 10k test), examples/resnet_fmnist.onnx
(a CIFAR-style ResNet-8, 78 K params, BatchNorm kept) and examples/lenet5.onnx. Per model:
  dense     `lopper train` from the example's weights, seed 0: SGD momentum 0.9, batch 128, cosine
            LR per epoch, VISION[model]'s epochs and LR (LeNet-5: bench/accuracy.py's 8 epochs at
            0.02; the ResNet: 4 epochs at 0.05, what the time budget allows at ~47 s an epoch)
  pruned    `lopper prune` of the dense model: 50% and 75% of the channels (`--structured channel`,
            L1 ranking: the model shrinks) and 95% of the weights unstructured (`--method l1
            --scope global`: zeros, held at zero while fine-tuning); test top-1 before recovery
  recovery  `lopper finetune` of each pruned model, --ft-epochs (2) at --ft-lr (0.01), SGD
            momentum 0.9, cosine, batch 128, per seed (--seeds 0,1: the shuffling), two arms:
              task     cross-entropy on the labels
              distill  + `--teacher DENSE --distill-alpha 0.5 --distill-temperature 2`:
                       0.5 x task + 0.5 x T^2 x KL(teacher || student) at T = 2 (fixed up front,
                       not tuned on the test set)
Accuracy: `lopper eval --json` top-1 on the 10k test images. Time: the epochs' own seconds
(OUT.train.json).

Part B, LLM (`--part llm`): bench/llm_corpus.py's byte-level LLaMA (4 layers, hidden 256, MLP 768,
4 heads; 3.54 M params, trained on Jane Austen, cached in ~/.cache/lopper/llm-corpus/<key>/).
Each pruned variant starts from a fresh copy of the dense module, pruned in place from Python on
the 128 cached calibration windows (8 batches of 16 x 128 bytes), as bench/llm_structured.py does:
  width 25% / 50%   lopper.prune_structured(unit="channel", method="activation", round_to=4): the
                    MLP neurons and the hidden size at one amount, solved by
                    llm_structured.solve_amount for ~25% / ~50% of the parameters
  depth 1 / 2 layers  lopper.prune_structured(unit="layer", method="loss"): the layers whose
                    skipping raises the model's own loss least (24.07% / 48.15%)
  sparsegpt 50%     lopper.prune(method="sparsegpt", amount=0.5, masks=False): every decoder
                    Linear half zeros, the kept weights updated (lm_head and embedding kept)
Each variant and the dense model are written with lopper.export_onnx (input_ids [B, T] -> logits
[B, T, 256], dynamic batch). Recovery data: --llm-windows (1024) random windows of 128 bytes of the
training split (llm_corpus.windows, seed 2) as `tokens:train_ids.npy`, --llm-epochs (2) epochs,
batch 16, AdamW (betas 0.9/0.999, eps 1e-8, weight decay 0), LR --llm-lr (1e-3) with cosine per
epoch and a linear warmup over the first --llm-warmup (0.25) epochs; the same batches for every
arm. Two arms: task (next-byte cross-entropy) and distill (`--teacher dense.onnx --distill-alpha 1
--distill-temperature 1`: logit distillation alone, Minitron's choice). The export keeps RoPE's
inv_freq (a PyTorch buffer) as an initializer; lopper.export_onnx lists the module's buffers in the
file's metadata (lopper.buffers) and lopper's trainer leaves them alone, as torch.optim does (the
check below measures what training it would change).
The peer, per arm: a plain PyTorch loop on the pruned module itself (a copy of the same starting
weights): torch.optim.AdamW with the same hyperparameters and per-step LR, the same batches in the
same order (lopper's shuffle reproduced: torch.randperm(n) with a generator seeded
splitmix64(seed + (epoch + 1) x 0x9E3779B97F4A7C15), src/data/loader.cpp's epoch_seed), the
loss F.cross_entropy over positions 0..T-2 (task) or F.kl_div(log_softmax(s/T),
log_softmax(t/T), log_target=True, reduction="batchmean") x T^2 over the same rows (distill; the
teacher the dense module under no_grad), pruned zeros held (gradients and weights masked after
every step). Its time is the epoch loops' wall time; lopper's is the sum of the epochs' `seconds`
in OUT.train.json (both the training loop only, 2 threads). The two take turns arm by arm (who
goes first alternates) and each timed run records os.getloadavg() at its start and end.
Check first (`check` in the JSON): the same recovery on 64 windows (2 epochs of 4 steps, seed 3)
by both sides must move every parameter alike: the relative difference of the updates,
max over parameters of ||dW_lopper - dW_torch|| / ||dW_torch||, for the task arm on width 25%, the
distill arm on sparsegpt 50%, and the task arm on a copy of the file without its buffer list
(inv_freq trained).
Perplexity: one evaluator for every row, llm_corpus.perplexity on the module (lopper's trained
weights loaded back into a copy of the pruned module by parameter name), on --eval-windows (1024)
held-out windows spread over the split (llm_corpus.eval_subset).

Usage:
  PYTHONPATH=build/python .venv/bin/python bench/recovery.py [--part vision|llm|all]
      [--lopper build/lopper] [--seeds 0,1] [--threads 2] [--out docs/bench-recovery.json]
  --table FILE: print the markdown tables of a results file.
A part run alone replaces that part of an existing --out file and keeps the other.
"""

import argparse
import copy
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import llm_corpus  # noqa: E402
import llm_structured  # noqa: E402  (solve_amount, count_params, shape_of, cpu_model)
from results import git_rev, mean, save_json  # noqa: E402  (bench/results.py)

# Part A. Dense training per model (seed 0), SGD momentum 0.9, batch 128, cosine per epoch.
VISION = {
    "resnet_fmnist": dict(epochs=4, lr=0.05),
    "lenet5": dict(epochs=8, lr=0.02),  # bench/accuracy.py's CONFIG
}
PRUNES = [  # (name, lopper prune flags)
    ("channel 50%", ["--structured", "channel", "--amount", "0.5"]),
    ("channel 75%", ["--structured", "channel", "--amount", "0.75"]),
    ("unstructured 95%", ["--method", "l1", "--scope", "global", "--amount", "0.95"]),
]
VISION_ALPHA, VISION_T = 0.5, 2.0
VISION_BATCH = 128

# Part B.
LLM_BATCH = 16
LLM_ALPHA, LLM_T = 1.0, 1.0
TRAIN_SEED = 2  # the recovery windows' draw (calibration is seed 1, the model's training seed 0)
CHECK = dict(windows=64, epochs=2, seed=3)
MASK64 = (1 << 64) - 1


def log(msg):
    print(f"[recovery] {msg}", file=sys.stderr, flush=True)


class LopperFailed(RuntimeError):
    """A lopper command that failed: the command and its message, reported as they are."""


def sh(cmd):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise LopperFailed(f"`{' '.join(cmd)}` exited {r.returncode}:\n{(r.stderr or r.stdout)[-3000:]}")
    return r, time.perf_counter() - t0


def load():
    return [round(x, 2) for x in os.getloadavg()]


def train_json(out):
    with open(out + ".train.json") as f:
        j = json.load(f)
    ep = j["epochs"]
    return dict(seconds=sum(e["seconds"] for e in ep), epochs=[
        {k: e.get(k) for k in ("epoch", "seconds", "loss", "task_loss", "distill_kl", "samples_per_s", "lr",
                               "sparsity")} for e in ep])


# --- Part A: vision -----------------------------------------------------------------------------

def top1(a, path):
    r, _ = sh([a.lopper, "eval", path, "--data", "fashion-mnist", "--json", "--batch-size", "1000",
               "--threads", str(a.threads)])
    return 100 * json.loads(r.stdout)["top1"]


def finetune_cmd(a, src, out, data, epochs, lr, optimizer, batch, seed, extra=()):
    return [a.lopper, "finetune", src, "--data", data, "-o", out, "--epochs", str(epochs), "--lr", str(lr),
            "--optimizer", optimizer, "--batch-size", str(batch), "--seed", str(seed), "--threads",
            str(a.threads), "--no-eval", *extra]


def vision_model(a, model, work, res):
    c = VISION[model]
    src = os.path.join(ROOT, "examples", model + ".onnx")
    dense = os.path.join(work, f"{model}.dense.onnx")
    log(f"{model}: dense training, {c['epochs']} epochs at lr {c['lr']}")
    l0 = load()
    sh([a.lopper, "train", src, "--data", "fashion-mnist", "-o", dense, "--epochs", str(c["epochs"]), "--lr",
        str(c["lr"]), "--lr-schedule", "cosine", "--momentum", "0.9", "--batch-size", str(VISION_BATCH), "--seed",
        "0", "--threads", str(a.threads), "--no-eval"])
    tj = train_json(dense)
    r, _ = sh([a.lopper, "inspect", dense, "--json"])
    prunable = sum(l["params"] for l in json.loads(r.stdout)["layers"])
    m = res[model] = dict(dense=dict(top1=top1(a, dense), prunable_weights=prunable, epochs=c["epochs"], lr=c["lr"],
                                     train_s=tj["seconds"], epoch_s=[e["seconds"] for e in tj["epochs"]],
                                     load_start=l0, load_end=load()), variants={})
    log(f"  dense top-1 {m['dense']['top1']:.2f}%, {prunable:,} prunable weights, "
        f"{tj['seconds']:.1f} s ({tj['seconds'] / c['epochs']:.1f} s/epoch)")
    for name, flags in PRUNES:
        p = os.path.join(work, f"{model}.{name.replace(' ', '').replace('%', '')}.onnx")
        r, dt = sh([a.lopper, "prune", dense, "-o", p, *flags, "--json", "--threads", str(a.threads)])
        rep = json.loads(r.stdout)
        v = dict(path=p, flags=flags, prune_s=round(dt, 2), top1_before=top1(a, p), runs=[])
        if "structured" in rep:
            v.update(params=rep["params"], params_dense=rep["params_before"], macs=rep["macs"],
                     macs_dense=rep["macs_before"])
            m["dense"]["params"] = rep["params_before"]
        else:
            v.update(nonzero=rep["nonzero"], nonzero_dense=rep["nonzero_before"], sparsity=rep["sparsity"])
        m["variants"][name] = v
        log(f"  {name}: top-1 before recovery {v['top1_before']:.2f}%")
    for seed in a.seed_list:
        for name, v in m["variants"].items():
            for arm in ("task", "distill"):
                out = os.path.join(work, f"{os.path.basename(v['path'])[:-5]}.{arm}.s{seed}.onnx")
                extra = ["--momentum", "0.9", "--lr-schedule", "cosine"]
                if arm == "distill":
                    extra += ["--teacher", dense, "--distill-alpha", str(VISION_ALPHA), "--distill-temperature",
                              str(VISION_T)]
                l0 = load()
                sh(finetune_cmd(a, v["path"], out, "fashion-mnist", a.ft_epochs, a.ft_lr, "sgd", VISION_BATCH,
                                seed, extra))
                tj = train_json(out)
                run = dict(arm=arm, seed=seed, top1=top1(a, out), seconds=tj["seconds"], epochs=tj["epochs"],
                           load_start=l0, load_end=load())
                v["runs"].append(run)
                log(f"  {name} {arm} seed {seed}: top-1 {run['top1']:.2f}% ({run['seconds']:.1f} s, "
                    f"load {l0[0]} -> {run['load_end'][0]})")
                a.save()


def vision_part(a, work):
    res = dict(settings=dict(models=VISION, prunes=[dict(name=n, flags=f) for n, f in PRUNES],
                             ft_epochs=a.ft_epochs, ft_lr=a.ft_lr, optimizer="sgd momentum 0.9",
                             schedule="cosine per epoch", batch=VISION_BATCH, seeds=a.seed_list,
                             distill=dict(alpha=VISION_ALPHA, temperature=VISION_T), threads=a.threads,
                             data="fashion-mnist (60k train, 10k test)"),
               models={})
    a.results["vision"] = res
    for model in a.vision_models:
        vision_model(a, model, work, res["models"])
    return res


# --- Part B: the LLM ----------------------------------------------------------------------------

def splitmix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def epoch_seed(seed, epoch):
    """src/data/loader.cpp's epoch_seed: the seed of the generator lopper's loader shuffles with."""
    return splitmix64((seed + epoch * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) & MASK64)


class Recipe:
    """The recovery's hyperparameters, the same for lopper and the peer."""

    def __init__(self, epochs, lr, warmup, seed, schedule="cosine"):
        self.epochs, self.lr, self.warmup, self.seed, self.schedule = epochs, lr, warmup, seed, schedule

    def lr_at(self, epoch, step, steps_per_epoch):
        """src/train/trainer.cpp's lr_at: cosine per epoch, then a linear warmup per step."""
        lr = self.lr
        if self.schedule == "cosine":
            lr = self.lr * 0.5 * (1 + math.cos(math.pi * epoch / self.epochs))
        warm = self.warmup * steps_per_epoch
        t = epoch * steps_per_epoch + step + 1
        if warm > 0 and t <= warm:
            lr *= t / warm
        return lr

    def lopper_flags(self):
        return ["--lr-schedule", self.schedule, "--warmup-epochs", str(self.warmup), "--weight-decay", "0"]

    def to_dict(self):
        return dict(epochs=self.epochs, lr=self.lr, warmup_epochs=self.warmup, seed=self.seed,
                    schedule=self.schedule + " per epoch", optimizer="adamw (0.9, 0.999, eps 1e-8, wd 0)",
                    batch=LLM_BATCH)


def lopper_recover(a, src, out, ids_path, recipe, teacher=None):
    extra = recipe.lopper_flags()
    if teacher:
        extra += ["--teacher", teacher, "--distill-alpha", str(LLM_ALPHA), "--distill-temperature", str(LLM_T)]
    sh(finetune_cmd(a, src, out, f"tokens:{ids_path}", recipe.epochs, recipe.lr, "adamw", LLM_BATCH, recipe.seed,
                    extra))
    return train_json(out)


def without_buffer_list(src, dst):
    """A copy of the export at `src` without its lopper.buffers metadata, at `dst`."""
    import onnx

    m = onnx.load(src)
    keep = [p for p in m.metadata_props if p.key != "lopper.buffers"]
    del m.metadata_props[:]
    m.metadata_props.extend(keep)
    onnx.save_model(m, dst, save_as_external_data=True, location=os.path.basename(dst) + ".data")
    return dst


def torch_recover(student, teacher, ids, recipe):
    """The peer: returns (trained module, {seconds, epochs: [...]}). teacher None: the task arm."""
    import torch
    import torch.nn.functional as F

    m = copy.deepcopy(student).train()
    keep = [(p, p.detach() != 0) for n, p in m.named_parameters() if p.ndim == 2 and bool((p == 0).any())]
    opt = torch.optim.AdamW(m.parameters(), lr=recipe.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    x_all = torch.from_numpy(ids)
    n = len(ids)
    spe = (n + LLM_BATCH - 1) // LLM_BATCH
    T = LLM_T
    epochs, total = [], 0.0
    for e in range(recipe.epochs):
        t0 = time.perf_counter()
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch_seed(recipe.seed, e)))
        sums = [0.0, 0.0, 0.0]
        rows = 0
        for k in range(spe):
            lr = recipe.lr_at(e, k, spe)
            for g in opt.param_groups:
                g["lr"] = lr
            x = x_all[order[k * LLM_BATCH:(k + 1) * LLM_BATCH]]
            s = m(input_ids=x).logits[:, :-1]
            s = s.reshape(-1, s.shape[-1])
            task = F.cross_entropy(s, x[:, 1:].reshape(-1))
            if teacher is not None:
                with torch.no_grad():
                    t = teacher(input_ids=x).logits[:, :-1].reshape(-1, s.shape[-1])
                kl = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True,
                              reduction="batchmean") * T * T
                loss = kl if LLM_ALPHA == 1 else (1 - LLM_ALPHA) * task + LLM_ALPHA * kl
            else:
                kl = torch.zeros(())
                loss = task
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for p, mask in keep:
                p.grad.mul_(mask)
            opt.step()
            with torch.no_grad():
                for p, mask in keep:
                    p.mul_(mask)
            r = s.shape[0]
            sums[0] += loss.item() * r
            sums[1] += task.item() * r
            sums[2] += kl.item() * r
            rows += r
        dt = time.perf_counter() - t0
        total += dt
        epochs.append(dict(epoch=e + 1, seconds=dt, loss=sums[0] / rows, task_loss=sums[1] / rows,
                           distill_kl=sums[2] / rows, samples_per_s=n / dt, lr=lr))
    return m.eval(), dict(seconds=total, epochs=epochs)


def onnx_params(path):
    import onnx
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def with_onnx_weights(module, path):
    """A copy of module with every parameter taken from the ONNX file's initializer of its name
    (lopper.export_onnx keeps the parameter names and PyTorch's layout: checked on export)."""
    import torch

    w = onnx_params(path)
    m = copy.deepcopy(module)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name not in w or tuple(w[name].shape) != tuple(p.shape):
                sys.exit(f"[recovery] {path}: no initializer {name} of shape {list(p.shape)}")
            p.copy_(torch.from_numpy(np.array(w[name], dtype=np.float32)))
    return m.eval()


def check_export(module, path):
    """The export holds every parameter under its own name, in its own layout, exactly."""
    w = onnx_params(path)
    for name, p in module.named_parameters():
        if name not in w or not np.array_equal(w[name], p.detach().numpy()):
            sys.exit(f"[recovery] {path}: initializer {name} is not the module's parameter")


def zeros(module):
    return sum(int((p == 0).sum()) for n, p in module.named_parameters() if p.ndim == 2)


def update_diff(start, a_mod, b_mod):
    """max over parameters of ||dA - dB|| / ||dB|| (dX = X's weights - start's), and the worst one."""
    sa, sb, s0 = dict(a_mod.named_parameters()), dict(b_mod.named_parameters()), dict(start.named_parameters())
    worst, name = 0.0, ""
    for k, p0 in s0.items():
        da = (sa[k] - p0).detach().double()
        db = (sb[k] - p0).detach().double()
        nb = float(db.norm())
        if nb == 0:
            continue
        r = float((da - db).norm()) / nb
        if r > worst:
            worst, name = r, k
    return worst, name


def variants(cfg, dense_params):
    """[(name, axis, call)]: call(model, batches, example) prunes model in place, returns notes."""
    import lopper

    r = cfg["num_attention_heads"]
    cfgh = dict(cfg, head_dim=cfg["hidden_size"] // r)
    out = []
    for t in (0.25, 0.5):
        amount, share = llm_structured.solve_amount(cfgh, ("mlp", "hidden"), (1 - t) * dense_params, dense_params)

        def width(model, batches, example, amount=amount):
            lopper.prune_structured(model, example, unit="channel", method="activation", amount=amount, round_to=r,
                                    data=batches, calib_batches=llm_structured.CALIB_BATCHES, progress=False)
            return dict(amount=amount)

        out.append((f"width {t:.0%}", "width", width))
    for n in (1, 2):
        def depth(model, batches, example, n=n):
            rep = lopper.prune_structured(model, example, unit="layer", method="loss", amount=n, data=batches,
                                          calib_batches=llm_structured.CALIB_BATCHES, progress=False)
            return dict(layers_removed=[g.layers[0] if g.layers else g.id for g in rep.groups
                                        if g.size_after < g.size_before])

        out.append((f"depth {n} layer{'s' if n > 1 else ''}", "depth", depth))

    def sparsegpt(model, batches, example):
        lopper.prune(model, example, method="sparsegpt", amount=0.5, data=batches, masks=False, progress=False)
        return dict(sparsity=llm_corpus.sparsity(model))

    out.append(("sparsegpt 50%", "unstructured", sparsegpt))
    return out


def llm_part(a, work):
    import torch
    import transformers as T

    import lopper

    torch.set_num_threads(a.threads)
    T.utils.logging.disable_progress_bar()
    info = llm_corpus.prepare(threads=a.threads)
    dense = llm_corpus.load_model(info["dir"])
    dense_params = sum(p.numel() for p in dense.parameters())
    calib = np.load(info["calib"])
    B = llm_structured.CALIB_BATCH
    batches = [{"input_ids": torch.from_numpy(calib[i:i + B])}
               for i in range(0, llm_structured.CALIB_BATCHES * B, B)]
    example = {"input_ids": torch.from_numpy(calib[:llm_structured.EXAMPLE])}
    eval_ids = llm_corpus.eval_subset(np.load(info["heldout"]), a.eval_windows)
    tr, _ = llm_corpus.splits()
    train_ids = llm_corpus.windows(tr, llm_corpus.SEQ, a.llm_windows, np.random.default_rng(TRAIN_SEED))
    ids_path = os.path.join(work, "train_ids.npy")
    np.save(ids_path, train_ids)
    check_ids = train_ids[:CHECK["windows"]]
    check_path = os.path.join(work, "check_ids.npy")
    np.save(check_path, check_ids)
    recipe = Recipe(a.llm_epochs, a.llm_lr, a.llm_warmup, a.llm_seed)
    check_recipe = Recipe(CHECK["epochs"], a.llm_lr, a.llm_warmup, CHECK["seed"])

    t0 = time.perf_counter()
    dense_ppl = llm_corpus.perplexity(dense, eval_ids)
    eval_s = time.perf_counter() - t0
    log(f"model {info['key']}: {dense_params:,} params, dense held-out perplexity {dense_ppl:.4f} on "
        f"{len(eval_ids)} windows ({eval_s:.1f} s)")
    teacher = os.path.join(work, "dense.onnx")
    lopper.export_onnx(dense, example, teacher)
    check_export(dense, teacher)
    eval_path = os.path.join(work, "eval_ids.npy")
    np.save(eval_path, eval_ids)
    r, _ = sh([a.lopper, "eval", teacher, "--data", f"tokens:{eval_path}", "--json", "--batch-size", "32",
               "--threads", str(a.threads)])
    lopper_dense_ppl = json.loads(r.stdout).get("perplexity")
    log(f"  lopper eval of the dense export: perplexity {lopper_dense_ppl}")
    s = llm_structured.shape_of(dense)
    res = dict(model=dict((k, info[k]) for k in ("key", "hf", "calib", "heldout", "config", "train", "corpus")),
               dense_params=int(dense_params), dense_ppl=dense_ppl, dense_ppl_lopper_eval=lopper_dense_ppl,
               dense_shape=f"{s['layers']}L h{s['hidden']} mlp{s['intermediate']} {s['heads']}x{s['head_dim']}",
               eval_windows=int(len(eval_ids)), eval_tokens=int(eval_ids[:, 1:].size),
               settings=dict(recipe=recipe.to_dict(), train_windows=int(len(train_ids)), window=llm_corpus.SEQ,
                             train_tokens_per_arm=int(len(train_ids) * (llm_corpus.SEQ - 1) * recipe.epochs),
                             train_seed=TRAIN_SEED, distill=dict(alpha=LLM_ALPHA, temperature=LLM_T),
                             calib=f"{llm_structured.CALIB_BATCHES} batches of {B} x {calib.shape[1]}",
                             threads=a.threads, check=CHECK),
               variants=[])
    a.results["llm"] = res
    cfg = dict(info["config"])
    todo = variants(cfg, dense_params)
    if a.only:
        todo = [v for v in todo if a.only in v[0]]
    starts = {}
    for name, axis, call in todo:
        model = copy.deepcopy(dense)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            notes = call(model, batches, example)
        prune_s = time.perf_counter() - t0
        model.eval()
        params = sum(p.numel() for p in model.parameters())
        ppl = llm_corpus.perplexity(model, eval_ids)
        path = os.path.join(work, f"{name.replace(' ', '_').replace('%', '')}.onnx")
        lopper.export_onnx(model, example, path)
        check_export(model, path)
        sh_ = llm_structured.shape_of(model)
        v = dict(name=name, axis=axis, notes=notes, params=int(params), removed=1 - params / dense_params,
                 nonzero=int(params - zeros(model)), shape=f"{sh_['layers']}L h{sh_['hidden']} "
                 f"mlp{sh_['intermediate']} {sh_['heads']}x{sh_['head_dim']}", prune_s=round(prune_s, 1),
                 ppl_before=ppl, arms={})
        res["variants"].append(v)
        starts[name] = (model, path)
        log(f"{name}: {params:,} params ({v['removed']:.2%} removed), {v['shape']}, ppl before recovery "
            f"{ppl:.4f}, prune {prune_s:.1f} s, {notes}")
        a.save()

    # The check: lopper and the peer move the weights alike on a short run.
    checks = []
    for name, arm, listed in (("width 25%", "task", True), ("sparsegpt 50%", "distill", True),
                              ("width 25%", "task", False)):
        if name not in starts:
            continue
        model, path = starts[name]
        out = os.path.join(work, f"check.{len(checks)}.onnx")
        if not listed:
            path = without_buffer_list(path, os.path.join(work, f"check.{len(checks)}.in.onnx"))
        lopper_recover(a, path, out, check_path, check_recipe, teacher if arm == "distill" else None)
        got = with_onnx_weights(model, out)
        peer, _ = torch_recover(model, dense if arm == "distill" else None, check_ids, check_recipe)
        worst, where = update_diff(model, got, peer)
        checks.append(dict(variant=name, arm=arm, buffers_listed=listed,
                           steps=check_recipe.epochs * CHECK["windows"] // LLM_BATCH,
                           max_relative_update_diff=worst, worst_param=where,
                           zeros_held=zeros(got) >= zeros(model) and zeros(peer) >= zeros(model)))
        log(f"check {name} {arm}{'' if listed else ' (no buffer list: inv_freq trained)'}: max relative update "
            "difference "
            f"{worst:.2e} ({where})")
    res["check"] = checks
    a.save()

    k = 0
    for v in res["variants"]:
        model, path = starts[v["name"]]
        for arm in ("task", "distill"):
            out = os.path.join(work, f"{os.path.basename(path)[:-5]}.{arm}.onnx")
            order = ("lopper", "torch") if k % 2 == 0 else ("torch", "lopper")
            k += 1
            rec = {}
            for side in order:
                l0 = load()
                if side == "lopper":
                    tj = lopper_recover(a, path, out, ids_path, recipe, teacher if arm == "distill" else None)
                    trained = with_onnx_weights(model, out)
                else:
                    trained, tj = torch_recover(model, dense if arm == "distill" else None, train_ids, recipe)
                l1 = load()
                rec[side] = dict(seconds=tj["seconds"], epochs=tj["epochs"], load_start=l0, load_end=l1,
                                 zeros_held=zeros(trained) >= zeros(model), ppl=llm_corpus.perplexity(trained, eval_ids))
                log(f"{v['name']} {arm} {side}: ppl {rec[side]['ppl']:.4f}, {tj['seconds']:.1f} s, load "
                    f"{l0[0]} -> {l1[0]}")
                del trained
            rec["first"] = order[0]
            rec["time_ratio"] = rec["lopper"]["seconds"] / rec["torch"]["seconds"]
            v["arms"][arm] = rec
            a.save()
    return res


# --- tables -------------------------------------------------------------------------------------

def vision_table(res):
    lines = []
    seeds = res["settings"]["seeds"]
    for model, m in res["models"].items():
        d = m["dense"]
        lines += [f"**{model}** (dense: {d['top1']:.2f}%, {d.get('params', 0):,} params, {d['epochs']} epochs, "
                  f"{d['train_s'] / d['epochs']:.1f} s an epoch)", "",
                  "| pruned | params (unstructured: nonzero weights) | before recovery | task: " + " / ".join(f"seed {s}" for s in seeds)
                  + " | task mean | distill: " + " / ".join(f"seed {s}" for s in seeds)
                  + " | distill mean | distill − task | s per run task / distill |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, v in m["variants"].items():
            cells = {}
            for arm in ("task", "distill"):
                rs = sorted([r for r in v["runs"] if r["arm"] == arm], key=lambda r: r["seed"])
                cells[arm] = (" / ".join(f"{r['top1']:.2f}" for r in rs), mean([r["top1"] for r in rs]) if rs else None,
                              mean([r["seconds"] for r in rs]) if rs else None)
            p = v.get("params", v.get("nonzero"))
            pd = v.get("params_dense", v.get("nonzero_dense"))
            t, dd = cells["task"], cells["distill"]
            diff = f"{dd[1] - t[1]:+.2f}" if t[1] is not None and dd[1] is not None else "—"
            lines.append(f"| {name} | {p:,} ({p / pd:.1%}) | {v['top1_before']:.2f} | {t[0]} | "
                         f"{t[1]:.2f} | {dd[0]} | {dd[1]:.2f} | {diff} | {t[2]:.0f} / {dd[2]:.0f} |"
                         if t[1] is not None and dd[1] is not None else f"| {name} | {p:,} | {v['top1_before']:.2f} | "
                         f"(incomplete) | | | | | |")
        lines.append("")
    return "\n".join(lines)


def llm_table(res):
    lines = ["| variant | params | removed | ppl before | task: lopper / PyTorch | distill: lopper / PyTorch | "
             "time task: lopper / PyTorch | time distill: lopper / PyTorch |",
             "|---|---|---|---|---|---|---|---|",
             f"| dense | {res['dense_params']:,} | 0 | {res['dense_ppl']:.3f} | — | — | — | — |"]
    for v in res["variants"]:
        cells = []
        for arm in ("task", "distill"):
            r = v["arms"].get(arm)
            cells.append(f"{r['lopper']['ppl']:.3f} / {r['torch']['ppl']:.3f}" if r else "—")
        for arm in ("task", "distill"):
            r = v["arms"].get(arm)
            cells.append(f"{r['lopper']['seconds']:.0f} s / {r['torch']['seconds']:.0f} s = {r['time_ratio']:.2f}"
                         if r else "—")
        nz = f" ({v['nonzero']:,} nonzero)" if v["nonzero"] < v["params"] else ""
        gone = (f"{1 - v['nonzero'] / res['dense_params']:.2%} (zeros)" if v["nonzero"] < v["params"]
                else f"{v['removed']:.2%}")
        lines.append(f"| {v['name']} ({v['shape']}) | {v['params']:,}{nz} | {gone} | "
                     f"{v['ppl_before']:.3f} | " + " | ".join(cells) + " |")
    ratios = [r["time_ratio"] for v in res["variants"] for r in v["arms"].values()]
    lt = sum(r["lopper"]["seconds"] for v in res["variants"] for r in v["arms"].values())
    tt = sum(r["torch"]["seconds"] for v in res["variants"] for r in v["arms"].values())
    if ratios:
        lines += ["", f"All arms: lopper {lt:.0f} s / PyTorch {tt:.0f} s = {lt / tt:.2f} (per arm "
                      f"{min(ratios):.2f}–{max(ratios):.2f})."]
    if res.get("check"):
        lines += ["", "| check (64 windows, 8 steps) | max relative update difference | worst parameter |",
                  "|---|---|---|"]
        for c in res["check"]:
            lines.append(f"| {c['variant']}, {c['arm']}"
                         f"{'' if c.get('buffers_listed', True) else ', without the buffer list (inv_freq trained)'}"
                         f" | {c['max_relative_update_diff']:.1e} | {c['worst_param']} |")
    return "\n".join(lines)


def tables(res):
    out = []
    if "vision" in res:
        out += ["Part A: Fashion-MNIST test top-1 (%)", "", vision_table(res["vision"])]
    if "llm" in res:
        out += ["Part B: held-out perplexity", "", llm_table(res["llm"])]
    for part in ("vision", "llm"):
        if part in res.get("errors", {}):
            out += ["", f"{part}: FAILED: {res['errors'][part]}"]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="all", choices=["vision", "llm", "all"])
    ap.add_argument("--lopper", default=os.path.join(ROOT, "build", "lopper"))
    ap.add_argument("--seeds", default="0,1", help="vision: the recovery's seeds (0,1)")
    ap.add_argument("--threads", type=int, default=2, help="lopper's and torch's threads (2)")
    ap.add_argument("--models", default="resnet_fmnist,lenet5", help="vision models (resnet_fmnist,lenet5)")
    ap.add_argument("--ft-epochs", type=int, default=2, help="vision: recovery epochs (2)")
    ap.add_argument("--ft-lr", type=float, default=0.01, help="vision: recovery LR (0.01)")
    ap.add_argument("--dense-epochs", type=int, default=0, help="vision: override the dense epochs (dev runs)")
    ap.add_argument("--llm-windows", type=int, default=1024, help="LLM: recovery windows of 128 bytes (1024)")
    ap.add_argument("--llm-epochs", type=int, default=2, help="LLM: recovery epochs (2)")
    ap.add_argument("--llm-lr", type=float, default=1e-3, help="LLM: AdamW LR (1e-3)")
    ap.add_argument("--llm-warmup", type=float, default=0.25, help="LLM: warmup epochs (0.25)")
    ap.add_argument("--llm-seed", type=int, default=0, help="LLM: the shuffling's seed (0)")
    ap.add_argument("--eval-windows", type=int, default=1024, help="LLM: held-out windows evaluated (1024)")
    ap.add_argument("--only", default="", help="LLM: only the variants whose name contains this")
    ap.add_argument("--work", default="", help="keep the models here (default: a temporary folder)")
    ap.add_argument("--out", default="", help="write the results here (JSON)")
    ap.add_argument("--table", default="", help="print the tables of a results file and stop")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            print(tables(json.load(f)))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(a.threads)
    a.seed_list = [int(s) for s in a.seeds.split(",") if s]
    a.vision_models = [m for m in a.models.split(",") if m]
    if a.dense_epochs:
        for c in VISION.values():
            c["epochs"] = a.dense_epochs
    results = {}
    if a.out and os.path.exists(a.out) and a.part != "all":
        with open(a.out) as f:
            results = json.load(f)
    r, _ = sh([a.lopper, "--version"])
    results.update(what="recovery after pruning: distillation vs fine-tuning, lopper vs PyTorch (bench/recovery.py)",
                   date=datetime.date.today().isoformat(),
                   env=dict(cpu=llm_structured.cpu_model(), machine=platform.machine(), cpus=os.cpu_count(),
                            python=platform.python_version(), torch=torch.__version__, lopper=r.stdout.strip(),
                            lopper_binary=a.lopper, commit=git_rev(),
                            lopper_built=datetime.datetime.fromtimestamp(os.path.getmtime(a.lopper)).isoformat(
                                timespec="seconds")))
    results.setdefault("errors", {})
    a.results = results
    a.save = (lambda: save_json(a.out, results, indent=1, default=str)) if a.out else (lambda: None)
    work = a.work or tempfile.mkdtemp(prefix="lopper-recovery-")
    os.makedirs(work, exist_ok=True)
    t_all = time.perf_counter()
    try:
        for part, fn in (("vision", vision_part), ("llm", llm_part)):
            if a.part not in (part, "all"):
                continue
            results["errors"].pop(part, None)
            t0 = time.perf_counter()
            try:
                fn(a, work)
                results[part]["wall_s"] = round(time.perf_counter() - t0, 1)
            except LopperFailed as e:
                results["errors"][part] = str(e)
                log(f"{part}: a lopper command failed, this part stops here:\n{e}")
            a.save()
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    results["wall_s"] = round(time.perf_counter() - t_all, 1)
    a.save()
    print(tables(results))


if __name__ == "__main__":
    main()
