"""lopper prune removes exactly the weights torch.nn.utils.prune removes, on the same weights.

For fixture models (and a small model whose weights are full of ties and zeros), runs `lopper prune`
and computes PyTorch's masks with torch.nn.utils.prune on the weights read from the same input file:
l1 local (l1_unstructured), l1 global (global_unstructured with L1Unstructured), a second round on
lopper's own output (PruningContainer: the amount counts from what is left), counts, row/column
(ln_structured with dim 0 / 1), and the counts of random (random_unstructured). Compares element by
element, checks that ONNX Runtime loads each output, prints "N passed, N failed".
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


def main():
    lopper, fixtures = sys.argv[1], sys.argv[2]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        ties = os.path.join(tmp, "ties.onnx")
        tie_model(ties)
        models = [(os.path.join(fixtures, s + ".onnx"), s, True) for s in MODELS]
        # Ties: which tied weights go is torch.topk's choice; row/column norms tie far less.
        models.append((ties, "ties", False))
        for src, stem, row_col in models:
            for name, fn in cases(lopper, src, tmp, stem, row_col):
                what = f"{stem}: {name}"
                try:
                    fn()
                    passed += 1
                    print(f"ok   {what}")
                except Exception as e:  # noqa: BLE001 - report every failure, keep going
                    failed += 1
                    msg = getattr(e, "stderr", None) or str(e)
                    print(f"FAIL {what}: {msg.strip()}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
