"""Depth pruning on real exported models (`lopper prune --structured block`): residual blocks of
torchvision's ResNets and the decoder layers of transformers' GPT-2 and LLaMA (an attention block
and its MLP block: one layer), from both exporters, ranked by block influence on calibration data
and at random. Every written model passes onnx's full checker, runs in ONNX Runtime with the
original output shape, agrees with lopper's own run of it (<= 1e-4 relative), lost the units the
report says (their weights are gone from the file), and is smaller; BERT's post-norm sub-layers are
blocks of their own. Usage: check_depth.py LOPPER FIXTURES_DIR
"""

import os
import sys
import tempfile

import onnx

sys.path.insert(0, os.path.dirname(__file__))
from cases import run  # noqa: E402
from check_structured import activation_data, check_outputs, feeds, prune, session  # noqa: E402

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


def main():
    lopper, fixtures = sys.argv[1], sys.argv[2]
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for stem in MODELS:
            for method in ("influence", "random"):
                cases.append((f"{stem} blocks by {method}",
                              lambda s=stem, m=method: check_depth(lopper, fixtures, tmp, s, m)))
        return run(cases, jobs=2)


if __name__ == "__main__":
    sys.exit(main())
