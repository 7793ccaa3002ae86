"""Structured pruning on real exported models: every shrunk model passes onnx's checker with shape
inference, runs in ONNX Runtime with the original output shape, agrees with lopper's own run of it
(<= 1e-4 relative), is smaller on disk, and lost the channels asked for; amount 0 is the identity.
A tied embedding (the output projection is the token embedding's table) stays one initializer.

Models: the fixtures of tests/fixtures/make_models.py — torchvision resnet18, resnet50, mobilenet_v2, mobilenet_v3_small (squeeze-excite),
vgg11_bn, densenet121 (concat), resnext50_32x4d (grouped conv), vit_b_16 and a TransformerEncoder,
each exported by both exporters, the CNNs with BatchNorm folded and kept from each (ts, dynamo,
preserve, dynamo_folded); transformers' GPT-2, BERT and LLaMA (grouped-query attention), and as
issue 18 met them: a BERT classifier and masked LM with dynamic batch and sequence axes (their
reshape targets computed from Shape at run time), and GPT-2 with n_embd 128 from torch.export.
Heads are counted in the written models (the [batch, seq, heads, head_dim] splits, run in ONNX
Runtime); the dynamic exports also run at another batch and sequence length.
Usage: check_structured.py LOPPER FIXTURES_DIR
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(__file__))
from cases import run  # noqa: E402

CNNS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "vgg11_bn", "densenet121", "resnext50_32x4d"]
# BatchNorm folded (ts: TorchScript folds it; dynamo_folded: folded in PyTorch) and kept (dynamo;
# preserve: TorchScript in TrainingMode.PRESERVE), from both exporters.
# transformers' GPT-2, BERT and a LLaMA-style LM (random init, tests/fixtures/make_models.py): their
# q/k/v splits, tied embeddings and attention reshapes, from both exporters.
LMS = ["gpt2", "bert", "llama"]
MODELS = [f"{m}.{e}" for m in CNNS for e in ("ts", "dynamo", "preserve", "dynamo_folded")] + [
    "transformer_encoder.ts", "transformer_encoder.dynamo", "vit_b_16.ts", "vit_b_16.dynamo"] + [
    f"{m}.{e}" for m in LMS for e in ("ts", "dynamo")]
INPUT_INDEX = {"input": 0, "src": 0, "input_ids": 0, "attention_mask": 1, "token_type_ids": 2}
# Exported with dynamic batch and sequence axes (tests/fixtures/make_models.py's DYNAMIC).
DYNAMIC_LMS = ["bert_cls", "bert_mlm"]


FORCED_KERNELS = "lopper-grouped,lopper-depthwise,lopper-direct,lopper-gemv,onednn-conv,aten"


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # two cases run at a time
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def feeds(sess, fixtures, name):
    return {i.name: np.load(os.path.join(fixtures, f"{name}.input_{INPUT_INDEX[i.name]}.npy"))
            for i in sess.get_inputs()}


def prune(lopper, src, out, *args):
    r = subprocess.run([lopper, "prune", src, "-o", out, "--json", *args], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise AssertionError(f"lopper prune failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def lopper_run(lopper, path, inputs, tmp):
    tmp = tempfile.mkdtemp(dir=tmp)  # cases run concurrently
    args = []
    for k, (name, v) in enumerate(inputs.items()):
        f = os.path.join(tmp, f"in{k}.npy")
        np.save(f, v)
        args += ["-i", f"{name}={f}"]
    outdir = os.path.join(tmp, "out")
    os.makedirs(outdir, exist_ok=True)
    # lopper's own kernels wherever a layer has one, else the library's, untimed: deterministic
    # coverage of its kernels on the shrunk (odd) channel counts, and no per-layer timing in every
    # one of the few hundred runs (with an empty kernel cache that timing alone outlasted the test).
    env = dict(os.environ, LOPPER_FORCE_KERNEL=FORCED_KERNELS)
    subprocess.run([lopper, "run", path, *args, "-o", outdir, "--threads", "1"], check=True,
                   capture_output=True, env=env)
    return outdir


def tied_weights(path):
    """Initializers that a Gather reads as its table and a MatMul or Gemm as its weight (directly or
    through a Transpose): tied embeddings, by name, with their shapes."""
    g = onnx.load(path, load_external_data=False).graph
    inits = {i.name: list(i.dims) for i in g.initializer}
    through = {n.output[0]: n.input[0] for n in g.node
               if n.op_type == "Transpose" and n.input[0] in inits}
    tables = {n.input[0] for n in g.node if n.op_type == "Gather" and n.input[0] in inits}
    weights = {through.get(n.input[1], n.input[1]) for n in g.node
               if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1}
    return {t: inits[t] for t in tables & weights}


def check_outputs(lopper, ref, got, out, x, tmp, where, versus):
    """The shrunk model `got` (at `out`) gives the original `ref`'s output shapes on `x`, and lopper's
    run of it agrees with ONNX Runtime's (<= 1e-4 relative). `where` starts the shape message,
    `versus` the agreement's."""
    want, have = ref.run(None, x), got.run(None, x)
    for w, h in zip(want, have):
        assert w.shape == h.shape, f"{where}output shape {h.shape}, the original has {w.shape}"
    outdir = lopper_run(lopper, out, x, tmp)
    for o, h in zip(got.get_outputs(), have):
        mine = np.load(os.path.join(outdir, o.name + ".npy"))
        rel = np.abs(mine - h).max() / max(np.abs(h).max(), 1e-12)
        assert rel <= 1e-4, f"{versus}: max rel diff {rel:.2e}"


def check_shrunk(lopper, fixtures, tmp, stem, amount, unit="channel", tag="", extra=()):
    src = os.path.join(fixtures, stem + ".onnx")
    out = os.path.join(tmp, f"{stem}.{unit}.{amount}{tag}.onnx")
    j = prune(lopper, src, out, "--structured", unit, "--amount", str(amount), *extra)
    onnx.checker.check_model(out, full_check=True)
    # A tie is one tensor before and after: sliced once, alike for the embedding and the layer.
    tied, still = tied_weights(src), tied_weights(out)
    assert still.keys() == tied.keys(), f"tied weights {sorted(tied)} became {sorted(still)}"
    names = [i.name for i in onnx.load(out, load_external_data=False).graph.initializer]
    for t in tied:
        assert not any(n.startswith(t + "_pruned") for n in names), f"{t} was copied"

    ref, got = session(src), session(out)
    check_outputs(lopper, ref, got, out, feeds(ref, fixtures, stem.split(".")[0]), tmp, "",
                  "lopper vs ONNX Runtime on the shrunk model")
    assert os.path.getsize(out) < os.path.getsize(src), "the shrunk model is not smaller on disk"
    assert j["params"] < j["params_before"] and j["macs"] < j["macs_before"], "params/MACs did not fall"
    # Every group that could be pruned lost round(amount * size) channels (fewer only to keep
    # equal grouped-conv blocks); the channels as a whole fell as asked within 3%, or the report
    # names the barriers that kept them.
    for g in j["groups"]:
        if "blocked" in g:
            continue
        blocks = g.get("blocks", 1)
        asked = min(round(amount * g["size_before"]), g["size_before"] - blocks)
        lost = g["size_before"] - g["size_after"]
        assert lost == asked - asked % blocks, \
            f"group {g['id']} lost {lost} of {g['size_before']} ({blocks} blocks), asked {asked}"
    frac = j["channels"] / j["channels_before"]
    assert abs(frac - (1 - amount)) <= 0.03 or j["barriers"], \
        f"channels kept {frac:.3f}, asked {1 - amount:.3f}, no barrier named"
    return j


def other_feeds(sess, batch=3, seq=11):
    """Inputs of a transformers LM at another batch and sequence length than its fixture's: ids
    (vocabulary 1000), a mask with the last sequence padded, token types 0 then 1."""
    rng = np.random.default_rng(1)
    x = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            v = rng.integers(0, 1000, (batch, seq))
        elif i.name == "attention_mask":
            v = np.ones((batch, seq))
            v[-1, seq - 3:] = 0
        else:
            v = np.zeros((batch, seq))
            v[:, seq // 2:] = 1
        x[i.name] = v.astype(np.int64)
    return x


def head_splits(path, x):
    """{Reshape node: (heads, head_dim)} for every split of a hidden axis into heads in the model
    at `path` ([batch, seq, heads, head_dim], read by a Transpose to [batch, heads, ...]), from
    ONNX Runtime's run on `x`."""
    m = onnx.load(path)
    readers = {}
    for n in m.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    splits = []
    for n in m.graph.node:
        if n.op_type == "Reshape" and any(
                r.op_type == "Transpose" and
                [list(a.ints) for a in r.attribute if a.name == "perm"] in ([[0, 2, 1, 3]], [[0, 2, 3, 1]])
                for r in readers.get(n.output[0], [])):
            splits.append(n)
    assert splits, f"{path}: no head split found"
    for n in splits:
        m.graph.output.append(onnx.helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = sess.run([n.output[0] for n in splits], x)
    return {n.name: tuple(v.shape[2:]) for n, v in zip(splits, got)}


def check_head_counts(src, out, x, unit):
    """Every head split of the written model has half the heads of the original's (--structured
    head: a grouped-query attention's key/value heads too) and the same head_dim, or (channels)
    the same heads and a head_dim no larger."""
    before, after = head_splits(src, x), head_splits(out, x)
    assert before.keys() == after.keys(), f"head splits {sorted(before)} became {sorted(after)}"
    for name, (h, d) in before.items():
        h2, d2 = after[name]
        if unit == "head":
            assert (h2, d2) == (h // 2, d), f"{name}: {h} heads of {d} became {h2} of {d2}, asked {h // 2}"
        else:
            assert h2 == h and d2 <= d, f"{name}: {h} heads of {d} became {h2} of {d2}"
    return before, after


def check_dynamic(lopper, fixtures, tmp, stem, amount, unit):
    """A dynamic-shape export: pruned like any model (check_shrunk), its batch and sequence stay
    symbolic, its heads are what was asked, and at batch 3, sequence 11 it runs in ONNX Runtime
    with the original's output shapes and lopper agrees with it."""
    j = check_shrunk(lopper, fixtures, tmp, stem, amount, unit)
    src = os.path.join(fixtures, stem + ".onnx")
    out = os.path.join(tmp, f"{stem}.{unit}.{amount}.onnx")
    for i in onnx.load(out).graph.input:
        dims = i.type.tensor_type.shape.dim
        assert all(d.dim_param for d in dims[:2]), f"input {i.name} lost its dynamic axes: {dims}"
    ref, got = session(src), session(out)
    x = other_feeds(ref)
    check_head_counts(src, out, x, unit)
    check_outputs(lopper, ref, got, out, x, tmp, "batch 3, seq 11: ",
                  "batch 3, seq 11: lopper vs ONNX Runtime")
    return j


def check_gqa_heads(lopper, fixtures, tmp, stem, tag="", extra=()):
    """LLaMA's grouped-query attention (4 query heads, 2 key/value heads): heads 50% removes one
    key/value head with the two query heads that read it, in each layer's one head group."""
    j = check_shrunk(lopper, fixtures, tmp, stem, 0.5, unit="head", tag=tag, extra=extra)
    heads = [g for g in j["groups"] if g["kind"] == "head" and "blocked" not in g]
    assert len(heads) == 2 and all((g["size_before"], g["size_after"]) == (2, 1) for g in heads), heads
    src = os.path.join(fixtures, stem + ".onnx")
    out = os.path.join(tmp, f"{stem}.head.0.5{tag}.onnx")
    before, _ = check_head_counts(src, out, feeds(session(src), fixtures, "llama"), "head")
    assert sorted(h for h, _ in before.values()) == [2, 2, 2, 2, 4, 4], before  # q, k, v per layer


def check_identity(lopper, fixtures, tmp, stem):
    src = os.path.join(fixtures, stem + ".onnx")
    out = os.path.join(tmp, f"{stem}.zero.onnx")
    prune(lopper, src, out, "--structured", "channel", "--amount", "0")
    ref, got = session(src), session(out)
    x = feeds(ref, fixtures, stem.split(".")[0])
    for w, h in zip(ref.run(None, x), got.run(None, x)):
        assert np.array_equal(w, h), "amount 0 changed the outputs"


def check_heads(lopper, fixtures, tmp, stem, heads_before):
    j = check_shrunk(lopper, fixtures, tmp, stem, 0.5, unit="head")
    heads = [g for g in j["groups"] if g["kind"] == "head" and "blocked" not in g]
    assert heads, "no head group found"
    for g in heads:
        assert g["size_before"] == heads_before and g["size_after"] == heads_before // 2, \
            f"heads {g['size_before']} -> {g['size_after']}"


def check_tie_kept(lopper, fixtures, tmp, stem):
    """The fixture's output projection is its token embedding's table, one initializer read by a
    Gather and, through a Transpose, by a MatMul (GPT-2's lm_head; BERT's masked-LM decoder, behind
    a dense layer of its own whose channels the tie couples with the hidden size): after the hidden
    size shrinks it is still one initializer, narrower, and the model runs (check_shrunk)."""
    tied = tied_weights(os.path.join(fixtures, stem + ".onnx"))
    assert tied, "the fixture has no tied embedding"
    check_shrunk(lopper, fixtures, tmp, stem, 0.3, tag=".tie")
    still = tied_weights(os.path.join(tmp, f"{stem}.channel.0.3.tie.onnx"))
    assert still.keys() == tied.keys(), f"tied weights {sorted(tied)} became {sorted(still)}"
    for t, shape in tied.items():
        assert still[t][0] == shape[0] and still[t][1] < shape[1], f"{t}: {shape} -> {still[t]}"


def check_shared_norm_tensors(lopper, tmp):
    """A fresh model exported with BatchNorm kept: the exporter stores equal tensors once and reads
    the copies through Identity nodes (running_var = Identity(weight), all ones). Each reader
    shrinks its own copy."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()
    x = torch.randn(1, 3, 16, 16)
    path = os.path.join(tmp, "fresh.ts.onnx")
    torch.onnx.export(m, (x,), path, dynamo=False, opset_version=17, input_names=["input"],
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    assert any(n.op_type == "Identity" for n in onnx.load(path).graph.node), "no shared tensor"
    np.save(os.path.join(tmp, "fresh.input_0.npy"), x.numpy())
    j = check_shrunk(lopper, tmp, tmp, "fresh.ts", 0.5)
    assert [g["size_after"] for g in j["groups"] if "blocked" not in g] == [4, 4]


def activation_data(fixtures, tmp, stem):
    """Calibration data for --method activation on fixture `stem`: four samples around the
    fixture's input (a CNN's image with noise and random labels, npy:X,Y) or four rows of random
    token IDs of its length (tokens:IDS): the --data spec and the batch size (the fixture's: its
    batch is static)."""
    name = stem.split(".")[0]
    x = np.load(os.path.join(fixtures, f"{name}.input_0.npy"))
    rng = np.random.default_rng(0)
    d = tempfile.mkdtemp(dir=tmp)
    if x.dtype == np.int64:
        ids = os.path.join(d, "ids.npy")
        np.save(ids, rng.integers(0, 1000, (4, x.shape[1])).astype(np.int64))
        return f"tokens:{ids}", x.shape[0]
    xs, ys = os.path.join(d, "x.npy"), os.path.join(d, "y.npy")
    np.save(xs, (x + rng.standard_normal((4,) + x.shape[1:])).astype(np.float32))
    np.save(ys, rng.integers(0, 1000, 4).astype(np.int64))
    return f"npy:{xs},{ys}", x.shape[0]


def check_activation(lopper, fixtures, tmp, stem, unit, amount):
    """--method activation (Minitron) on calibration data: the model shrinks as any other
    criterion shrinks it (check_shrunk: ONNX Runtime runs it, lopper agrees), every pruned group
    has a positive score, and heads go whole (check_gqa_heads)."""
    data, batch = activation_data(fixtures, tmp, stem)
    extra = ("--method", "activation", "--data", data, "--calib-batches", "2", "--batch-size",
             str(batch))
    if unit == "head":
        check_gqa_heads(lopper, fixtures, tmp, stem, tag=".activation", extra=extra)
        return
    j = check_shrunk(lopper, fixtures, tmp, stem, amount, unit, tag=".activation", extra=extra)
    assert j["method"] == "activation", j["method"]
    pruned = [g for g in j["groups"] if "blocked" not in g]
    assert pruned and all(g["score"] > 0 for g in pruned), [g["score"] for g in pruned]


def check_scale_from_shape_pins(lopper, fixtures, tmp):
    """TorchScript's attention computes 1/sqrt(head_dim) from Shape at run time: pruning head_dim
    would change that scale, so those channels stay, and the report says why."""
    src = os.path.join(fixtures, "transformer_encoder.ts.onnx")
    j = prune(lopper, src, os.path.join(tmp, "te.hd.onnx"), "--structured", "channel", "--amount", "0.5")
    heads = [g for g in j["groups"] if g["kind"] == "head"]
    assert heads and all("channel count" in g.get("blocked", "") for g in heads), heads


def main():
    lopper, fixtures = sys.argv[1], sys.argv[2]
    os.environ["OMP_NUM_THREADS"] = "1"  # lopper prune's ATen pool: two cases run at a time
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for stem in MODELS:
            for amount in (0.3, 0.5):
                cases.append((f"{stem} channels {amount:.0%}",
                              lambda s=stem, a=amount: check_shrunk(lopper, fixtures, tmp, s, a)))
        for stem in ("resnet18.ts", "densenet121.dynamo", "transformer_encoder.dynamo"):
            cases.append((f"{stem} amount 0 is the identity",
                          lambda s=stem: check_identity(lopper, fixtures, tmp, s)))
        for stem in ("gpt2.dynamo", "bert_mlm.dynamo"):
            cases.append((f"{stem} tied embedding stays one initializer",
                          lambda s=stem: check_tie_kept(lopper, fixtures, tmp, s)))
        cases.append(("BatchNorm tensors shared through Identity",
                      lambda: check_shared_norm_tensors(lopper, tmp)))
        cases.append(("transformer_encoder.dynamo heads 50%",
                      lambda: check_heads(lopper, fixtures, tmp, "transformer_encoder.dynamo", 4)))
        cases.append(("transformer_encoder.ts heads 50% (targets computed from Shape)",
                      lambda: check_heads(lopper, fixtures, tmp, "transformer_encoder.ts", 4)))
        cases.append(("transformer_encoder.ts head_dim kept: its scale comes from Shape",
                      lambda: check_scale_from_shape_pins(lopper, fixtures, tmp)))
        cases.append(("vit_b_16.dynamo heads 50%",
                      lambda: check_heads(lopper, fixtures, tmp, "vit_b_16.dynamo", 12)))
        for stem in ("gpt2.ts", "gpt2.dynamo", "bert.ts", "bert.dynamo"):
            cases.append((f"{stem} heads 50%",
                          lambda s=stem: check_heads(lopper, fixtures, tmp, s, 4)))
        for stem in ("llama.ts", "llama.dynamo"):
            cases.append((f"{stem} grouped-query heads 50%",
                          lambda s=stem: check_gqa_heads(lopper, fixtures, tmp, s)))
        # Issue 18: dynamic batch and sequence (targets computed from Shape), heads and channels.
        for stem in (f"{m}.{e}" for m in DYNAMIC_LMS for e in ("ts", "dynamo")):
            for unit, amount in (("head", 0.5), ("channel", 0.3), ("channel", 0.5)):
                cases.append((f"{stem} {unit}s {amount:.0%}, dynamic axes",
                              lambda s=stem, u=unit, a=amount: check_dynamic(lopper, fixtures, tmp, s, a, u)))
        # Activation importance (Minitron) on calibration data: CNN channels, grouped-query heads.
        for stem, unit, amount in (("resnet18.ts", "channel", 0.3),
                                   ("mobilenet_v2.dynamo", "channel", 0.3),
                                   ("llama.ts", "head", 0.5)):
            cases.append((f"{stem} {unit}s {amount:.0%} by activation",
                          lambda s=stem, u=unit, a=amount: check_activation(lopper, fixtures, tmp,
                                                                             s, u, a)))
        # Issue 18's GPT-2 (n_embd 128, ids [1, 16]): the full checker passes (no stale value_info).
        for stem in ("gpt2_wide.dynamo", "gpt2_wide.ts"):
            for amount in (0.25, 0.5):
                cases.append((f"{stem} channels {amount:.0%}",
                              lambda s=stem, a=amount: check_shrunk(lopper, fixtures, tmp, s, a)))
        return run(cases, jobs=2)


if __name__ == "__main__":
    sys.exit(main())
