"""lopper prune removes exactly the weights torch.nn.utils.prune removes, on the same weights.

For fixture models (and a small model whose weights are full of ties and zeros), runs `lopper prune`
and computes PyTorch's masks with torch.nn.utils.prune on the weights read from the same input file:
l1 local (l1_unstructured), l1 global (global_unstructured with L1Unstructured), a second round on
lopper's own output (PruningContainer: the amount counts from what is left), counts, row/column
(ln_structured with dim 0 / 1), the counts of random (random_unstructured), and a YAML recipe
(each layer as its rule says). grad and taylor: a small MLP exported by torch is calibrated on the
same batch in both; PyTorch's gradients of the same cross-entropy give the scores that
l1_unstructured / global_unstructured / ln_structured take as importance_scores. Compares element by
element (for grad/taylor, a weight may differ only where its score ties the threshold to float
rounding), checks that ONNX Runtime loads each output, prints "N passed, N failed".
Usage: check_prune_parity.py LOPPER FIXTURES_DIR
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import helper, numpy_helper
from torch.nn.utils import prune

from cases import run as run_cases

MODELS = ["mlp.ts", "small_cnn.ts"]


def weights(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def lopper_prune(lopper, src, out, *flags):
    subprocess.run([lopper, "prune", src, "-o", out, *flags], check=True, capture_output=True,
                   text=True)
    ort.InferenceSession(out, providers=["CPUExecutionProvider"])  # loads in ONNX Runtime
    with open(out + ".report.json") as f:
        return json.load(f)


def modules(src, names):
    """One module per weight holding it as a Parameter, with the zeros already there as its mask
    (PyTorch's view of a pruned model: lopper treats a zero weight as pruned)."""
    w = weights(src)
    mods = []
    for n in names:
        m = torch.nn.Module()
        m.weight = torch.nn.Parameter(torch.from_numpy(w[n].copy()))
        prune.custom_from_mask(m, "weight", m.weight.detach() != 0)
        mods.append(m)
    return mods


def torch_mask(m):
    return m.weight_mask.bool().numpy()


def lopper_mask(out, names):
    w = weights(out)
    return [w[n] != 0 for n in names]


def amount_arg(a):
    return float(a) if "." in a else int(a)


def check(what, got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{what}: layer {i}: shape {g.shape} != {w.shape}"
        diff = int((g != w).sum())
        assert diff == 0, f"{what}: layer {i}: {diff} of {g.size} weights differ"


def tie_model(path):
    """Gemm -> Gemm whose weights take 7 values (many ties, some zeros)."""
    rng = np.random.default_rng(0)
    w1 = (rng.integers(-3, 4, size=(32, 64)) / 4).astype(np.float32)
    w2 = (rng.integers(-3, 4, size=(10, 32)) / 4).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", transB=1),
             helper.make_node("Gemm", ["h", "w2"], ["y"], name="fc2", transB=1)]
    g = helper.make_graph(nodes, "ties", [helper.make_tensor_value_info("x", 1, [1, 64])],
                          [helper.make_tensor_value_info("y", 1, [1, 10])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def cases(lopper, src, tmp, stem, row_col):
    """(name, function) pairs; each function raises on a mismatch."""
    def names_of(report):
        return [l["weight"] for l in report["layers"]]

    def local(amount):
        out = os.path.join(tmp, f"{stem}.l1.{amount}.onnx")
        names = names_of(lopper_prune(lopper, src, out, "--method", "l1", "--amount", amount))
        mods = modules(src, names)
        for m in mods:
            prune.l1_unstructured(m, "weight", amount=amount_arg(amount))
        check("l1 local", lopper_mask(out, names), [torch_mask(m) for m in mods])

    def global_(amount):
        out = os.path.join(tmp, f"{stem}.global.{amount}.onnx")
        names = names_of(lopper_prune(lopper, src, out, "--method", "l1", "--amount", amount,
                                      "--scope", "global"))
        mods = modules(src, names)
        prune.global_unstructured([(m, "weight") for m in mods],
                                  pruning_method=prune.L1Unstructured, amount=amount_arg(amount))
        check("l1 global", lopper_mask(out, names), [torch_mask(m) for m in mods])

    def cumulative():
        first = os.path.join(tmp, f"{stem}.c1.onnx")
        second = os.path.join(tmp, f"{stem}.c2.onnx")
        names = names_of(lopper_prune(lopper, src, first, "--method", "l1", "--amount", "0.5"))
        lopper_prune(lopper, first, second, "--method", "l1", "--amount", "0.3", "--scope", "global")
        mods = modules(src, names)
        for m in mods:
            prune.l1_unstructured(m, "weight", amount=0.5)
        prune.global_unstructured([(m, "weight") for m in mods],
                                  pruning_method=prune.L1Unstructured, amount=0.3)
        check("cumulative", lopper_mask(second, names), [torch_mask(m) for m in mods])

    def structured(pattern, norm):
        out = os.path.join(tmp, f"{stem}.{pattern}.{norm}.onnx")
        names = names_of(lopper_prune(lopper, src, out, "--method", "l1", "--amount", "0.4",
                                      "--pattern", pattern, "--norm", str(norm)))
        mods = modules(src, names)
        for m in mods:
            prune.ln_structured(m, "weight", amount=0.4, n=norm, dim=0 if pattern == "row" else 1)
        check(f"{pattern} L{norm}", lopper_mask(out, names), [torch_mask(m) for m in mods])

    def random(scope):
        out = os.path.join(tmp, f"{stem}.random.{scope}.onnx")
        report = lopper_prune(lopper, src, out, "--method", "random", "--amount", "0.3",
                              "--seed", "7", "--scope", scope)
        names = names_of(report)
        mods = modules(src, names)
        if scope == "local":
            for m in mods:
                prune.random_unstructured(m, "weight", amount=0.3)
        else:
            prune.global_unstructured([(m, "weight") for m in mods],
                                      pruning_method=prune.RandomUnstructured, amount=0.3)
        got = [int(x.sum()) for x in lopper_mask(out, names)]
        want = [int(torch_mask(m).sum()) for m in mods]
        if scope == "local":
            assert got == want, f"random local: kept {got}, torch keeps {want}"
        else:
            assert sum(got) == sum(want), f"random global: kept {sum(got)}, torch {sum(want)}"

    def sparse():
        dense = os.path.join(tmp, f"{stem}.dense.onnx")
        packed = os.path.join(tmp, f"{stem}.sparse.onnx")
        lopper_prune(lopper, src, dense, "--method", "l1", "--amount", "0.9")
        report = lopper_prune(lopper, src, packed, "--method", "l1", "--amount", "0.9",
                              "--sparse-initializers")
        assert onnx.load(packed).graph.sparse_initializer, "no sparse_initializer written"
        assert report["file_bytes_after"] < report["file_bytes_before"], "the file did not shrink"
        w = {t.name: numpy_helper.to_array(t) for t in onnx.load(dense).graph.initializer}
        for t in onnx.load(packed).graph.sparse_initializer:
            v = numpy_helper.to_array(t.values)
            i = numpy_helper.to_array(t.indices)
            got = np.zeros(int(np.prod(t.dims)), v.dtype)
            got[i.reshape(-1) if i.ndim == 1 else np.ravel_multi_index(i.T, t.dims)] = v
            assert np.array_equal(got.reshape(tuple(t.dims)), w[t.values.name]), t.values.name

    yield "l1 local 0.3", lambda: local("0.3")
    yield "l1 local 0.5", lambda: local("0.5")
    yield "l1 local count 40", lambda: local("40")
    yield "l1 global 0.6", lambda: global_("0.6")
    yield "l1 global count 1000", lambda: global_("1000")
    yield "cumulative 0.5 then global 0.3", cumulative
    if row_col:
        for pattern in ("row", "column"):
            for norm in (1, 2):
                yield f"{pattern} L{norm} 0.4", lambda p=pattern, n=norm: structured(p, n)
    yield "sparse initializers (0.9)", sparse
    yield "random local (counts)", lambda: random("local")
    yield "random global (count)", lambda: random("global")


def recipe_case(lopper, src, tmp):
    """A recipe: the first layer skipped, the last layer by l1 0.6, the rest by the defaults
    (row L2 0.25); each compared with the torch call that rule stands for."""
    recipe = os.path.join(tmp, "recipe.yaml")
    with open(recipe, "w") as f:
        f.write("defaults: {method: l1, amount: 0.25, pattern: row, norm: 2}\n"
                "rules:\n"
                "  - {match: '^/1/Gemm$', skip: true}\n"
                "  - {match: '^/5/Gemm$', amount: 0.6, pattern: unstructured}\n")
    out = os.path.join(tmp, "recipe.onnx")
    report = lopper_prune(lopper, src, out, "--recipe", recipe)
    layers = {l["name"]: l for l in report["layers"]}
    assert set(layers) == {"/1/Gemm", "/3/Gemm", "/5/Gemm"}, f"layers {sorted(layers)}"
    assert layers["/1/Gemm"].get("skipped", "").endswith("skip"), layers["/1/Gemm"]
    names = [layers[n]["weight"] for n in ("/1/Gemm", "/3/Gemm", "/5/Gemm")]
    mods = modules(src, names)
    prune.ln_structured(mods[1], "weight", amount=0.25, n=2, dim=0)
    prune.l1_unstructured(mods[2], "weight", amount=0.6)
    check("recipe", lopper_mask(out, names), [torch_mask(m) for m in mods])


class Saliency:
    """A torch MLP exported to ONNX, a calibration batch in .npy, and PyTorch's own scores."""

    def __init__(self, tmp):
        torch.manual_seed(3)
        self.net = torch.nn.Sequential(torch.nn.Linear(48, 40), torch.nn.ReLU(), torch.nn.Linear(40, 24),
                                       torch.nn.ReLU(), torch.nn.Linear(24, 10))
        self.src = os.path.join(tmp, "calib_mlp.onnx")
        torch.onnx.export(self.net, (torch.randn(2, 48),), self.src, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(96, 48, generator=g)
        self.y = torch.randint(0, 10, (96,), generator=g)
        self.data = "npy:" + os.path.join(tmp, "x.npy") + "," + os.path.join(tmp, "y.npy")
        np.save(os.path.join(tmp, "x.npy"), self.x.numpy())
        np.save(os.path.join(tmp, "y.npy"), self.y.numpy())
        loss = torch.nn.functional.cross_entropy(self.net(self.x), self.y)
        loss.backward()
        self.scores = {}
        for name, p in self.net.named_parameters():
            if name.endswith("weight"):
                self.scores[name] = {"grad": p.grad.abs(), "taylor": (p.detach() * p.grad).abs()}

    def case(self, lopper, tmp, method, scope, pattern="unstructured"):
        out = os.path.join(tmp, f"calib.{method}.{scope}.{pattern}.onnx")
        # One batch holding every sample: the batch does not depend on the shuffling order.
        report = lopper_prune(lopper, self.src, out, "--method", method, "--amount", "0.4", "--scope",
                              scope, "--pattern", pattern, "--data", self.data, "--batch-size", "96",
                              "--calib-batches", "1")
        names = [l["weight"] for l in report["layers"]]
        assert sorted(names) == sorted(self.scores), f"weights {names}"
        mods = modules(self.src, names)
        scores = [self.scores[n][method] for n in names]
        if scope == "global":
            prune.global_unstructured([(m, "weight") for m in mods], pruning_method=prune.L1Unstructured,
                                      amount=0.4, importance_scores={(m, "weight"): s for m, s in zip(mods, scores)})
        elif pattern == "unstructured":
            for m, s in zip(mods, scores):
                prune.l1_unstructured(m, "weight", amount=0.4, importance_scores=s)
        else:
            for m, s in zip(mods, scores):
                prune.ln_structured(m, "weight", amount=0.4, n=1, dim=0 if pattern == "row" else 1,
                                    importance_scores=s)
        got, want = lopper_mask(out, names), [torch_mask(m) for m in mods]
        kept = [s[torch.from_numpy(w)] for s, w in zip(scores, want)]
        for i, (g, w) in enumerate(zip(got, want)):
            diff = g != w
            if not diff.any():
                continue
            # Only near-ties may differ: lopper's and PyTorch's gradients agree to float rounding.
            assert pattern == "unstructured", f"{method} {pattern}: layer {i}: {int(diff.sum())} differ"
            cut = float(min(k.min() for k in kept)) if scope == "global" else float(kept[i].min())
            near = np.abs(scores[i].numpy()[diff] - cut) <= 1e-5 * max(cut, 1e-12)
            assert near.all(), f"{method} {scope}: layer {i}: {int(diff.sum())} weights differ, " \
                               f"{int((~near).sum())} not near the threshold"


def main():
    lopper, fixtures = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        ties = os.path.join(tmp, "ties.onnx")
        tie_model(ties)
        models = [(os.path.join(fixtures, s + ".onnx"), s, True) for s in MODELS]
        # Ties: which tied weights go is torch.topk's choice; row/column norms tie far less.
        models.append((ties, "ties", False))
        todo = [(f"{stem}: {name}", fn) for src, stem, row_col in models
                for name, fn in cases(lopper, src, tmp, stem, row_col)]
        todo.append(("mlp.ts: recipe (skip, l1 0.6, row L2 defaults)",
                     lambda: recipe_case(lopper, os.path.join(fixtures, "mlp.ts.onnx"), tmp)))
        calib = Saliency(tmp)
        for method in ("grad", "taylor"):
            for scope in ("local", "global"):
                todo.append((f"calib_mlp: {method} {scope} 0.4",
                             lambda m=method, sc=scope: calib.case(lopper, tmp, m, sc)))
            for pattern in ("row", "column"):
                todo.append((f"calib_mlp: {method} {pattern} 0.4",
                             lambda m=method, p=pattern: calib.case(lopper, tmp, m, "local", p)))
        return run_cases(todo)


if __name__ == "__main__":
    sys.exit(main())
