"""Every model lopper writes must pass onnx's checker (with shape inference) and run in ONNX Runtime
with the outputs of the model it came from.

Writes each fixture model back with `lopper convert` three ways (as read, with sparse initializers,
with external data), then checks each file. Usage: check_written_models.py LOPPER FIXTURES_DIR
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

MODELS = ["mlp.ts", "small_cnn.preserve", "resnet18.dynamo", "transformer_encoder.ts", "gpt2.dynamo"]
VARIANTS = {"plain": [], "sparse": ["--sparse-initializers"], "external": ["--external-data"]}


# Which fixture input file feeds a graph input (tests/fixtures/make_models.py's input names).
INPUT_INDEX = {"input": 0, "src": 0, "input_ids": 0, "attention_mask": 1}


def run(path, original, fixtures, name):
    """Outputs of `path` and of `original` in ONNX Runtime, on the fixture's inputs."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(original, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.load(os.path.join(fixtures, f"{name}.input_{INPUT_INDEX[i.name]}.npy"))
             for i in ref.get_inputs()}
    return sess.run(None, feeds), ref.run(None, feeds)


def main():
    lopper, fixtures = sys.argv[1], sys.argv[2]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for stem in MODELS:
            src = os.path.join(fixtures, stem + ".onnx")
            name = stem.split(".")[0]
            for variant, flags in VARIANTS.items():
                out = os.path.join(tmp, f"{stem}.{variant}.onnx")
                what = f"{stem} ({variant})"
                try:
                    subprocess.run([lopper, "convert", src, "-o", out, *flags], check=True,
                                   capture_output=True, text=True)
                    onnx.checker.check_model(out, full_check=True)
                    got, want = run(out, src, fixtures, name)
                    for g, w in zip(got, want):
                        assert g.shape == w.shape, f"shape {g.shape} != {w.shape}"
                        assert np.array_equal(g, w), f"max |diff| {np.abs(g - w).max()}"
                    if variant == "external":
                        assert os.path.exists(out + ".data"), "no external data file written"
                    passed += 1
                    print(f"ok   {what}")
                except Exception as e:  # noqa: BLE001 - report every failure, keep going
                    failed += 1
                    msg = getattr(e, "stderr", None) or str(e)
                    print(f"FAIL {what}: {msg.strip().splitlines()[-1] if msg.strip() else e}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
