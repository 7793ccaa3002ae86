"""What a hostile user of the Python package tries: numbers of other types, empty batches, NaN and
Inf through every fused kernel, paths with a NUL, sessions made as onnxruntime's users make them.
Each is checked against PyTorch or ONNX Runtime where they have an answer: Python never dies, a
wrong argument is the right exception with one line, and a NaN stays a NaN."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper

import lopper
from conftest import mlp

SOURCE = Path(__file__).resolve().parents[2]
CNN = SOURCE / "examples" / "cnn_small.onnx"
sys.path.append(str(SOURCE / "tests"))
from robustness import training_bn_model  # noqa: E402 (tests/robustness.py: the CLI's model)


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(str(model) if isinstance(model, Path) else model, so,
                             providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def run_in_child(code):
    """Runs `code` in a fresh interpreter (a crash kills the child, not the test run)."""
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)


# --- amounts of other number types ---------------------------------------------------------------

def weights_of(m):
    return [p.detach().clone() for n, p in m.named_parameters() if n.endswith("weight")]


@pytest.mark.parametrize("amount,same_as", [
    (torch.tensor(0.5), 0.5), (np.array(0.5), 0.5), (np.float32(0.5), 0.5),
    (torch.tensor(0.5, dtype=torch.float64), 0.5),
    # an integer one is a count, as an int is
    (torch.tensor(100), 100), (np.array(100), 100), (np.int64(100), 100)])
def test_a_0d_tensor_or_array_is_the_number_it_holds(amount, same_as):
    want, x = mlp()
    lopper.prune(want, x, method="l1", amount=same_as)
    got, _ = mlp()
    lopper.prune(got, x, method="l1", amount=amount)
    for a, b in zip(weights_of(want), weights_of(got)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("amount", [torch.tensor([0.5, 0.5]), np.array([0.5]), "0.5",
                                    [0.5], torch.tensor([]), torch.tensor([[0.5]])])
@pytest.mark.parametrize("fn", ["prune", "prune_structured"])
def test_an_amount_that_is_not_one_number_is_a_type_error(amount, fn):
    m, x = mlp()
    before = weights_of(m)
    kw = {"method": "l1"} if fn == "prune" else {}
    with pytest.raises(TypeError, match=r"^\[prune\] amount must be"):
        getattr(lopper, fn)(m, x, amount=amount, **kw)
    for a, b in zip(before, weights_of(m)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fn", ["prune", "prune_structured"])
def test_a_tensor_amount_never_crashes_python(fn):
    # The crash this guards against killed the interpreter: run it in a child.
    kw = "method='l1', " if fn == "prune" else ""
    r = run_in_child(
        "import torch, lopper\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))\n"
        "x = torch.randn(2, 8)\n"
        f"lopper.{fn}(m, x, {kw}amount=torch.tensor(0.5))\n"
        "print('ok')\n")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


@pytest.mark.parametrize("amount", [2 ** 63, 2 ** 100, -(2 ** 70)])
def test_a_count_past_int64_is_a_value_error(amount):
    m, x = mlp()
    with pytest.raises(ValueError, match=r"^\[prune\] amount"):
        lopper.prune(m, x, method="l1", amount=amount)


# --- empty batches ----------------------------------------------------------------------------

KERNELS = ["", "lopper-winograd", "lopper-direct", "onednn-conv", "onednn-direct", "lopper-gemv", "onednn",
           "aten"]


def session_with(path, kernel, monkeypatch):
    if kernel:
        monkeypatch.setenv("LOPPER_FORCE_KERNEL", kernel)
    else:
        monkeypatch.delenv("LOPPER_FORCE_KERNEL", raising=False)
    monkeypatch.setenv("LOPPER_KERNEL_CACHE", "")  # choices made now, not read from a cache
    return lopper.InferenceSession(path if isinstance(path, bytes) else str(path), threads=2)


@pytest.mark.parametrize("kernel", KERNELS)
def test_an_empty_batch_after_a_full_one_is_empty(kernel, monkeypatch):
    s = session_with(CNN, kernel, monkeypatch)
    x = np.random.default_rng(0).standard_normal((1, 1, 28, 28)).astype(np.float32)
    (y1,) = s.run(None, {"image": x})
    (y0,) = s.run(None, {"image": x[:0]})
    (want,) = ort_run(CNN, {"image": x[:0]})
    assert y0.shape == want.shape == (0, y1.shape[1])
    (y1_again,) = s.run(None, {"image": x})
    np.testing.assert_array_equal(y1, y1_again)


def test_an_empty_batch_first_then_a_full_one(monkeypatch):
    s = session_with(CNN, "", monkeypatch)
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    (y0,) = s.run(None, {"image": x[:0]})
    assert y0.shape[0] == 0
    (y,) = s.run(None, {"image": x})
    (want,) = ort_run(CNN, {"image": x})
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


# --- NaN and Inf through the fused kernels ---------------------------------------------------

def fused_model(kind, act):
    """x -> Conv (3x3, pad 1) or Gemm -> activation: the pairs lopper fuses into one kernel."""
    rng = np.random.default_rng(1)
    nodes, inits = [], []
    if kind == "conv":
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 12, 12])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16, 12, 12])
        inits.append(onnx.numpy_helper.from_array(
            rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w"))
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"))
        nodes.append(helper.make_node("Conv", ["x", "w", "b"], ["z"], pads=[1, 1, 1, 1]))
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])
        inits.append(onnx.numpy_helper.from_array(
            rng.standard_normal((32, 64)).astype(np.float32), "w"))
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b"))
        nodes.append(helper.make_node("Gemm", ["x", "w", "b"], ["z"], transB=1))
    if act == "Clip":
        inits += [onnx.numpy_helper.from_array(np.array(-1, np.float32), "lo"),
                  onnx.numpy_helper.from_array(np.array(1, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", ["z", "lo", "hi"], ["y"]))
    elif act == "LeakyRelu":
        nodes.append(helper.make_node("LeakyRelu", ["z"], ["y"], alpha=0.1))
    else:
        nodes.append(helper.make_node(act, ["z"], ["y"]))
    g = helper.make_graph(nodes, "fused", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def poisoned(shape, seed=2):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[::7] = np.nan
    flat[3::11] = np.inf
    flat[5::13] = -np.inf
    return x


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("act", ["Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish",
                                 "Sigmoid"])
@pytest.mark.parametrize("kind,shape", [("conv", (2, 8, 12, 12)), ("gemm", (3, 64)),
                                        ("gemm", (64, 64))])
def test_nan_and_inf_come_out_as_onnxruntime_gives_them(kind, shape, act, kernel, monkeypatch):
    model = fused_model(kind, act)
    x = poisoned(shape)
    (want,) = ort_run(model, {"x": x})
    s = session_with(model, kernel, monkeypatch)
    (got,) = s.run(None, {"x": x})
    assert np.isnan(want).any(), "the case must reach a NaN"
    if kernel == "lopper-winograd" and kind == "conv":
        # Winograd's transforms mix a tile's inputs: a non-finite input makes its tile NaN.
        assert np.isnan(got[np.isnan(want)]).all()
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)


# --- paths with a NUL ------------------------------------------------------------------------

def test_a_session_path_with_a_nul_is_a_value_error(tmp_path):
    (tmp_path / "a").write_bytes(CNN.read_bytes())
    with pytest.raises(ValueError, match="null"):
        lopper.InferenceSession(str(tmp_path / "a") + "\0x.onnx")


def test_a_report_path_with_a_nul_is_a_value_error(tmp_path):
    m, x = mlp()
    report = lopper.prune(m, x, method="l1", amount=0.5)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    with pytest.raises(ValueError, match="null"):
        report.save_html(str(victim) + "\0.html")
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]


def test_a_recipe_path_with_a_nul_is_a_value_error(tmp_path):
    m, x = mlp()
    (tmp_path / "r").write_text("defaults: {method: l1, amount: 0.5}\n")
    with pytest.raises(ValueError, match="null"):
        lopper.prune(m, x, recipe=str(tmp_path / "r") + "\0.yaml")


# --- arguments as onnxruntime's and PyTorch's users write them ---------------------------------

def test_onnxruntime_style_session_arguments_are_honoured():
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = lopper.InferenceSession(str(CNN), so, providers=["CPUExecutionProvider"])
    assert s.threads == 1 and s.device == "cpu"
    s = lopper.InferenceSession(str(CNN), sess_options=so,
                                providers=[("CPUExecutionProvider", {})])
    assert s.threads == 1
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    np.testing.assert_allclose(s.run(None, {"image": x})[0], ort_run(CNN, {"image": x})[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kwargs,message", [
    ({"providers": ["TensorrtExecutionProvider"]}, "is not one lopper runs"),
    ({"providers": []}, "empty"),
    ({"providers": ["CPUExecutionProvider"], "device": "cpu"}, "not both"),
    ({"provider_options": [{}]}, "needs providers"),
    ({"threads": 10 ** 6}, "threads must be"),
    ({"threads": -1}, "threads must be"),
    ({"threads": 2 ** 40}, "out of range"),
    ({"device": "tpu"}, "bad device"),
])
def test_session_arguments_that_do_not_map_are_one_line_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        lopper.InferenceSession(str(CNN), **kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs", [{"providers": "CPUExecutionProvider"}, {"threads": 1.5},
                                    {"sess_options": 3}, {"threads": True}])
def test_session_arguments_of_the_wrong_type_are_type_errors(kwargs):
    with pytest.raises(TypeError, match=r"^\[session\]"):
        lopper.InferenceSession(str(CNN), **kwargs)


@pytest.mark.parametrize("fn,kwargs,message", [
    ("prune", {"method": "random", "amount": 0.5, "seed": -1}, "seed must be"),
    ("prune", {"method": "random", "amount": 0.5, "seed": 2 ** 70}, "seed must be"),
    ("prune_structured", {"amount": 0.5, "seed": -1}, "seed must be"),
    ("prune", {"method": "l1", "amount": 0.5, "device": "tpu"}, "bad device"),
    ("prune_structured", {"amount": 0.5, "device": "tpu"}, "bad device"),
    ("prune_structured", {"amount": 0.5, "rtol": float("nan")}, "rtol"),
    ("prune_structured", {"amount": 0.5, "rtol": -1.0}, "rtol"),
])
def test_bad_values_are_value_errors(fn, kwargs, message):
    m, x = mlp()
    before = weights_of(m)
    with pytest.raises(ValueError, match=message):
        getattr(lopper, fn)(m, x, **kwargs)
    for a, b in zip(before, weights_of(m)):
        assert torch.equal(a, b)


class TakesADict(nn.Module):
    """A module whose only argument is a dict (torch reads a trailing dict as keywords)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, batch):
        return self.b(torch.relu(self.a(batch["x"])))


def test_a_module_whose_only_argument_is_a_dict_prunes():
    torch.manual_seed(0)
    m = TakesADict()
    x = ({"x": torch.randn(4, 16)},)
    report = lopper.prune(m, x, method="l1", amount=0.5)
    assert abs(float((m.a.weight == 0).float().mean()) - 0.5) < 0.01
    assert report is not None
    torch.manual_seed(0)
    m = TakesADict()
    lopper.prune_structured(m, x, amount=0.5)
    assert m.a.out_features < 32
    assert m(x[0]).shape == (4, 8)


def test_a_recipe_that_holds_itself_or_nests_too_deep_is_a_value_error():
    m, x = mlp()
    loop = {"defaults": {"method": "l1", "amount": 0.5}}
    loop["rules"] = [loop]
    with pytest.raises(ValueError, match=r"^\[prune\] recipe"):
        lopper.prune(m, x, recipe=loop)
    deep = {}
    for _ in range(200000):
        deep = {"a": deep}
    with pytest.raises(ValueError, match=r"^\[prune\] recipe"):
        lopper.prune(m, x, recipe={"defaults": {"method": "l1", "amount": 0.5}, "x": deep})
    with pytest.raises(TypeError, match=r"^\[prune\] recipe"):
        lopper.prune(m, x, recipe={"defaults": {"method": "l1", "amount": torch.tensor(0.5)}})


# --- grouped-query heads on a dynamic export ---------------------------------------------------

def test_gqa_heads_on_a_dynamic_export_go_with_their_key_value_heads(tmp_path):
    """A LLaMA with grouped-query attention exported with dynamic batch and sequence: the key/value
    heads' repeat (Expand to a shape computed at run time, then Reshape) is followed, so --structured
    head removes whole key/value groups with their query heads, exactly as on the static export."""
    transformers = pytest.importorskip("transformers")
    import warnings
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=4,
                                   intermediate_size=128, max_position_embeddings=64,
                                   attn_implementation="eager", use_cache=False)
    lm = transformers.LlamaForCausalLM(cfg).eval()

    class Logits(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits

    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=60)
    example = (torch.randint(0, 200, (2, 12)),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(lm), example, dynamo=True, dynamic_shapes=({0: batch, 1: seq},),
                          input_names=["input_ids"], output_names=["logits"]).save(
                              str(tmp_path / "llama.onnx"))
        torch.onnx.export(Logits(lm), example, dynamo=True, input_names=["input_ids"],
                          output_names=["logits"]).save(str(tmp_path / "static.onnx"))
    lopper_cli = Path(os.environ.get("LOPPER_BUILD_DIR", SOURCE / "build")) / "lopper"

    def prune(src, out, *flags):
        r = subprocess.run([str(lopper_cli), "prune", str(tmp_path / src), *flags, "-o",
                            str(tmp_path / out)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads((tmp_path / (out + ".report.json")).read_text())

    dyn = prune("llama.onnx", "heads.onnx", "--structured", "head", "--amount", "0.5")
    static = prune("static.onnx", "heads_static.onnx", "--structured", "head", "--amount", "0.5")
    heads = [(g["size_before"], g["size_after"], g["removed"]) for g in dyn["groups"]
             if g["kind"] == "head"]
    assert len(heads) == 2 and all(h[:2] == (4, 2) for h in heads), heads  # kv groups of 2 q heads
    assert heads == [(g["size_before"], g["size_after"], g["removed"]) for g in static["groups"]
                     if g["kind"] == "head"]
    ids = np.random.default_rng(0).integers(0, 200, (2, 12)).astype(np.int64)
    got = ort_run(tmp_path / "heads.onnx", {"input_ids": ids})[0]
    want = ort_run(tmp_path / "heads_static.onnx", {"input_ids": ids})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    ids = np.random.default_rng(1).integers(0, 200, (3, 17)).astype(np.int64)
    assert ort_run(tmp_path / "heads.onnx", {"input_ids": ids})[0].shape == (3, 17, 200)
    # Channels (the MLP's and the hidden size's that can go) shrink and run too.
    prune("llama.onnx", "channels.onnx", "--structured", "channel", "--amount", "0.3")
    assert ort_run(tmp_path / "channels.onnx", {"input_ids": ids})[0].shape == (3, 17, 200)


def test_a_structured_report_counts_what_pytorch_counts():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    m = torchvision.models.resnet18().eval()
    want = sum(p.numel() for p in m.parameters())
    report = lopper.prune_structured(m, torch.randn(1, 3, 64, 64), amount=0.25, progress=False)
    assert report.params_before == want  # 11,689,512, not the export's 11,694,312
    assert report.params == sum(p.numel() for p in m.parameters()) < want


def test_a_session_on_batchnorm_in_training_mode_warns_once(tmp_path):
    path = tmp_path / "bn.onnx"
    onnx.save(training_bn_model(np.random.default_rng(0)), str(path))  # the CLI's case too
    with pytest.warns(UserWarning, match=r"1 BatchNormalization node in training mode \('bn'\)"):
        lopper.InferenceSession(str(path))
    with pytest.warns(UserWarning, match="training mode") as w:
        lopper.InferenceSession(path.read_bytes())
    assert len([x for x in w if "training mode" in str(x.message)]) == 1
    # The same graph in inference mode loads without a word.
    m = onnx.load(str(path))
    m.graph.node[0].attribute[0].i = 0
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lopper.InferenceSession(m.SerializeToString())


def test_a_target_on_a_module_with_a_nan_weight_names_it_and_empties_no_layer():
    m, x = mlp()
    with torch.no_grad():
        m[1].weight[0, 0] = float("nan")
    with pytest.warns(UserWarning, match=r"weight '.*' holds 1 non-finite value"):
        report = lopper.prune_to_target(m, x, params=0.5, progress=False)
    assert all(layer.amount < 0.95 for layer in report.layers)
    assert torch.isnan(m[1].weight[0, 0])
