"""lopper train takes the same steps PyTorch takes, on the same model and data.

A small CNN with BatchNorm (and an MLP) is exported by the venv's torch; both lopper (`lopper train`,
the ONNX graph under its own autograd) and PyTorch (the nn.Module, torch.optim) train it from the
same weights on the same .npy data. One batch holds the whole dataset, so the shuffling order does
not matter and every step sees the same samples. After E epochs the weights and BatchNorm running
statistics must agree to float rounding, for SGD (momentum, Nesterov, weight decay), Adam and AdamW,
with and without an L1 penalty, and with a pruned model whose zeros PyTorch holds with
torch.nn.utils.prune (masks) — the zeros must stay exactly zero. Distilled from a teacher
(`--teacher`, another CNN of the same shape in eval mode): PyTorch's loss is
(1 - a) * cross_entropy + a * T^2 * kl_div(log_softmax(s / T), log_softmax(t / T), log_target=True,
reduction="batchmean"), plus the MSE between a hidden layer's outputs (`--distill-state`).
Prints "N passed, N failed".
Usage: check_training.py LOPPER
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import numpy_helper
from torch.nn.utils import prune

from cases import run as run_cases

torch.set_num_threads(2)
N = 48


def cnn(seed=0):
    torch.manual_seed(seed)
    # NOTE: no conv bias before BatchNorm: BN cancels it, so its gradient is rounding noise that
    # Adam's normalisation would blow up into +-lr steps in both frameworks alike.
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 16), nn.ReLU(), nn.Linear(16, 5))


def export(model, path, shape):
    model.eval()
    torch.onnx.export(model, (torch.randn(2, *shape),), path, dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["logits"], do_constant_folding=False,
                      training=torch.onnx.TrainingMode.PRESERVE,
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})


def weights(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def hidden(model):
    """The output of the first Linear (the tensor --distill-state names), captured by a hook."""
    seen = {}
    model[5].register_forward_hook(lambda m, i, o: seen.__setitem__("h", o))
    return seen


def torch_train(model, x, y, epochs, opt_name, lr, l1=0.0, masks=None, teacher=None, alpha=0.5, T=1.0,
                state=0.0, **kw):
    model.train()
    if teacher is not None:
        teacher.eval()
        s_seen, t_seen = hidden(model), hidden(teacher)
    params = list(model.parameters())
    if opt_name == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=kw.get("momentum", 0.9), nesterov=kw.get("nesterov", False),
                              weight_decay=kw.get("weight_decay", 0.0))
    elif opt_name == "adam":
        opt = torch.optim.Adam(params, lr=lr, weight_decay=kw.get("weight_decay", 0.0))
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=kw.get("weight_decay", 0.0))
    for _ in range(epochs):
        opt.zero_grad()
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        if teacher is not None:
            with torch.no_grad():
                t_out = teacher(x)
            kl = nn.functional.kl_div(nn.functional.log_softmax(out / T, 1), nn.functional.log_softmax(t_out / T, 1),
                                      log_target=True, reduction="batchmean") * T * T
            loss = (1 - alpha) * loss + alpha * kl
            if state:
                loss = loss + state * nn.functional.mse_loss(s_seen["h"], t_seen["h"])
        if l1:
            loss = loss + l1 * sum(m.weight.abs().sum() for m in model if isinstance(m, (nn.Conv2d, nn.Linear)))
        loss.backward()
        opt.step()
    return model


def state(model):
    """The model's weights and BN statistics by ONNX initializer name (Sequential index names)."""
    out = {}
    for name, t in model.state_dict().items():
        if name.endswith("num_batches_tracked") or name.endswith("_mask"):
            continue
        out[name.replace("_orig", "")] = t.detach().numpy()
    return out


def case(lopper, tmp, name, opt_name, lr, epochs=4, l1=0.0, pruned=False, distill=None, **kw):
    model = cnn()
    shape = (1, 12, 12)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(N, *shape, generator=g)
    y = torch.randint(0, 5, (N,), generator=g)
    xs, ys = os.path.join(tmp, "x.npy"), os.path.join(tmp, "y.npy")
    np.save(xs, x.numpy())
    np.save(ys, y.numpy())
    src = os.path.join(tmp, f"{name}.onnx")
    layers = [m for m in model if isinstance(m, (nn.Conv2d, nn.Linear))]
    if pruned:
        for m in layers:
            prune.l1_unstructured(m, "weight", amount=0.5)
            prune.remove(m, "weight")  # zeros in the exported weights ...
    export(model, src, shape)
    if pruned:
        for m in layers:
            prune.custom_from_mask(m, "weight", m.weight.detach() != 0)  # ... held in torch
    before = weights(src)
    out = os.path.join(tmp, f"{name}.out.onnx")
    flags = ["--optimizer", opt_name, "--lr", str(lr), "--epochs", str(epochs), "--batch-size", str(N)]
    if "momentum" in kw:
        flags += ["--momentum", str(kw["momentum"])]
    if kw.get("nesterov"):
        flags += ["--nesterov"]
    if kw.get("weight_decay"):
        flags += ["--weight-decay", str(kw["weight_decay"])]
    if l1:
        flags += ["--l1", str(l1)]
    if opt_name == "sgd" and "momentum" not in kw:
        flags += ["--momentum", "0.9"]
    teacher = None
    if distill is not None:
        teacher = cnn(seed=7)  # the student's shape, other weights
        tsrc = os.path.join(tmp, f"{name}.teacher.onnx")
        export(teacher, tsrc, shape)
        flags += ["--teacher", tsrc, "--distill-alpha", str(distill["alpha"]), "--distill-temperature",
                  str(distill["T"])]
        if distill.get("state"):
            # The first Linear's output in the export (torch.onnx names it after the module).
            names = [n.output[0] for n in onnx.load(src).graph.node if n.op_type == "Gemm"]
            flags += ["--distill-state", f"{names[0]}={names[0]}", "--distill-state-weight", str(distill["state"])]
    r = subprocess.run([lopper, "train", src, "--data", f"npy:{xs},{ys}", "-o", out, *flags],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr.strip()
    got = weights(out)
    dkw = {}
    if distill is not None:
        dkw = dict(teacher=teacher, alpha=distill["alpha"], T=distill["T"], state=distill.get("state", 0.0))
    want = state(torch_train(model, x, y, epochs, opt_name, lr, l1=l1, **dkw, **kw))
    for k, w in want.items():
        assert k in got, f"{k} missing from lopper's output (has {sorted(got)})"
        err = float(np.abs(got[k] - w).max())
        scale = max(float(np.abs(w).max()), 1e-6)
        assert err <= 1e-4 * scale + 1e-6, f"{k}: max |lopper - torch| = {err:.3g} (scale {scale:.3g})"
        if pruned and k.endswith("weight") and before[k].ndim > 1:
            zeros = before[k] == 0
            assert (got[k][zeros] == 0).all(), f"{k}: a pruned weight moved"
            assert (got[k][~zeros] != before[k][~zeros]).any(), f"{k}: nothing trained"


def main():
    lopper = sys.argv[1]
    cases = [
        ("sgd momentum wd", dict(opt_name="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3)),
        ("sgd nesterov", dict(opt_name="sgd", lr=0.05, momentum=0.9, nesterov=True)),
        ("adam", dict(opt_name="adam", lr=0.01, weight_decay=1e-4)),
        ("adamw", dict(opt_name="adamw", lr=0.01, weight_decay=0.1)),
        ("sgd + l1 penalty", dict(opt_name="sgd", lr=0.05, l1=1e-3)),
        ("pruned, sgd momentum: zeros held", dict(opt_name="sgd", lr=0.05, pruned=True, weight_decay=1e-3)),
        ("pruned, adam: zeros held", dict(opt_name="adam", lr=0.01, pruned=True)),
        ("distilled, alpha 0.5 T 2", dict(opt_name="sgd", lr=0.05, distill=dict(alpha=0.5, T=2.0))),
        ("distilled alone (alpha 1), pruned, adam", dict(opt_name="adam", lr=0.01, pruned=True,
                                                         distill=dict(alpha=1.0, T=1.0))),
        ("distilled, alpha 0.3 T 4 + hidden-state MSE", dict(opt_name="sgd", lr=0.05,
                                                             distill=dict(alpha=0.3, T=4.0, state=0.5))),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        return run_cases((what, lambda i=i, kw=kw: case(lopper, tmp, f"c{i}", **kw))
                         for i, (what, kw) in enumerate(cases))


if __name__ == "__main__":
    sys.exit(main())
