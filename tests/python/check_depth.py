"""Depth pruning on real exported models (`lopper prune --structured block`): residual blocks of
torchvision's ResNets and the decoder layers of transformers' GPT-2 and LLaMA (an attention block
and its MLP block: one layer), from both exporters, ranked by block influence on calibration data
and at random. Every written model passes onnx's full checker, runs in ONNX Runtime with the
original output shape, agrees with lopper's own run of it (<= 1e-4 relative), lost the units the
report says (their weights are gone from the file), and is smaller; BERT's post-norm sub-layers are
blocks of their own. The hidden size too (`--structured channel`): the residual streams of GPT-2
(LayerNormalization, torch.export), LLaMA (RMSNorm spelled out: ReduceMean over the channels) and
a BERT classifier (both exporters) shrink with their embedding tables, every norm's scale and
every projection in and out, checked the same way.
Usage: check_depth.py LOPPER FIXTURES_DIR
"""

import os
import sys
import tempfile

import onnx

sys.path.insert(0, os.path.dirname(__file__))
from cases import run  # noqa: E402
from check_structured import (activation_data, check_outputs, check_shrunk, feeds,  # noqa: E402
                              prune, session)

# stem -> (units expected, kind of each)
MODELS = {
    "resnet18.ts": (5, "block"), "resnet18.dynamo": (5, "block"),
    "resnet50.ts": (12, "block"), "resnet50.dynamo": (12, "block"),
    "gpt2.ts": (2, "layer"), "gpt2.dynamo": (2, "layer"),
    "llama.ts": (2, "layer"), "llama.dynamo": (2, "layer"),
    "bert.ts": (4, "block"), "bert.dynamo": (4, "block"),
}


def check_depth(lopper, fixtures, tmp, stem, method):
    units, kind = MODELS[stem]
    src = os.path.join(fixtures, stem + ".onnx")
    out = os.path.join(tmp, f"{stem}.block.{method}.onnx")
    amount = "1" if units <= 4 else "0.5"
    extra = ["--method", method]
    if method == "influence":
        data, batch = activation_data(fixtures, tmp, stem)
        extra += ["--data", data, "--calib-batches", "2", "--batch-size", str(batch)]
    else:
        extra += ["--seed", "3"]
    j = prune(lopper, src, out, "--structured", "block", "--amount", amount, *extra)
    groups = j["groups"]
    assert len(groups) == units, f"{len(groups)} units, want {units}"
    assert all(g["kind"] == kind for g in groups), [g["kind"] for g in groups]
    free = [g for g in groups if "blocked" not in g]
    gone = [g for g in free if g["size_after"] == 0]
    want = int(amount) if "." not in amount else round(float(amount) * len(free))
    assert len(gone) == want and j["blocks"] == len(free) - want, (len(gone), want, j["blocks"])
    if method == "influence":
        # The lowest block influence goes first.
        kept_scores = [g["score"] for g in free if g["size_after"] == 1]
        assert max(g["score"] for g in gone) <= min(kept_scores), [g["score"] for g in free]
        assert all(0 <= g["score"] <= 2 for g in free)
    onnx.checker.check_model(out, full_check=True)
    # The removed units' weights are gone from the file; the kept units' are there.
    names = {i.name for i in onnx.load(out, load_external_data=False).graph.initializer}
    before = {i.name for i in onnx.load(src, load_external_data=False).graph.initializer}
    assert names < before, "no initializer went"
    ref, got = session(src), session(out)
    check_outputs(lopper, ref, got, out, feeds(ref, fixtures, stem.split(".")[0]), tmp, "",
                  "lopper vs ONNX Runtime on the model without its blocks")
    assert os.path.getsize(out) < os.path.getsize(src), "not smaller on disk"
    assert j["params"] < j["params_before"] and j["macs"] < j["macs_before"], "params/MACs"


def embedding_width(path):
    """The width of the token embedding table (the initializer a Gather reads)."""
    g = onnx.load(path, load_external_data=False).graph
    inits = {i.name: list(i.dims) for i in g.initializer}
    tables = [inits[n.input[0]] for n in g.node if n.op_type == "Gather" and n.input[0] in inits
              and len(inits[n.input[0]]) == 2]
    return max(t[1] for t in tables)


def check_hidden(lopper, fixtures, tmp, stem):
    j = check_shrunk(lopper, fixtures, tmp, stem, 0.5, tag=".hidden")
    src = os.path.join(fixtures, stem + ".onnx")
    out = os.path.join(tmp, f"{stem}.channel.0.5.hidden.onnx")
    before, after = embedding_width(src), embedding_width(out)
    assert after == before // 2, f"the embedding is {after} wide, was {before}"
    hidden = [g for g in j["groups"] if g["size_before"] == before and "blocked" not in g]
    assert hidden and hidden[0]["size_after"] == before // 2, "no hidden-size group pruned"


def main():
    lopper, fixtures = sys.argv[1], sys.argv[2]
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for stem in MODELS:
            for method in ("influence", "random"):
                cases.append((f"{stem} blocks by {method}",
                              lambda s=stem, m=method: check_depth(lopper, fixtures, tmp, s, m)))
        # (gpt2.ts: TorchScript folds the position ids to a constant, and a Gather by constant
        # indices starts no channels: the Add of the two embeddings keeps the hidden size, and the
        # report says so.)
        for stem in ("gpt2.dynamo", "llama.ts", "llama.dynamo", "bert_cls.ts", "bert_cls.dynamo"):
            cases.append((f"{stem} hidden size 50%",
                          lambda s=stem: check_hidden(lopper, fixtures, tmp, s)))
        return run(cases, jobs=2)


if __name__ == "__main__":
    sys.exit(main())
