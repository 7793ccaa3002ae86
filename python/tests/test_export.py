"""lopper.export_onnx: a module (pruned, or a transformers model as it comes) written as an ONNX
file with external data, that lopper's executor and ONNX Runtime both run to the module's outputs;
bad input refused with nothing written."""
import os

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn

import lopper
from lopper import _prune as lopper_prune_module

ort = pytest.importorskip("onnxruntime")


def _cnn():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(16, 10)).eval()
    return m, torch.randn(2, 3, 16, 16)


def _ort(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    return s.run(None, {n: f.numpy() for n, f in zip(names, feeds)})


def _lopper(path, feeds):
    s = lopper.InferenceSession(str(path))
    names = [i.name for i in s.get_inputs()]
    return [np.asarray(o) for o in s.run(None, dict(zip(names, feeds)))]


def _tiny_llama():
    """A 2-layer LlamaForCausalLM with grouped-query heads (vocabulary 96, hidden 64), seeded."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128)
    return transformers.LlamaForCausalLM(cfg).eval()


def _close(got, want):
    want = want.detach().numpy()
    scale = max(float(np.abs(want).max()), 1e-6)
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-4 * scale


@pytest.mark.filterwarnings("ignore:.*torch.nn.utils.prune masks")
def test_a_pruned_module_is_written_with_its_zeros_and_keeps_its_masks(tmp_path):
    m, x = _cnn()
    lopper.prune(m, x, amount=0.6, progress=False)
    path = tmp_path / "cnn.onnx"
    assert lopper.export_onnx(m, x, path) == str(path)
    assert os.path.exists(str(path) + ".data")
    assert sorted(os.listdir(tmp_path)) == ["cnn.onnx", "cnn.onnx.data"]  # no temporary left
    assert hasattr(m[0], "weight_orig")  # the module keeps its masks
    model = onnx.load(str(path))  # reads the external data beside it
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for name in ("0.weight", "3.weight", "7.weight"):
        want = dict(m.named_modules())[name[0]].weight.detach().numpy()
        assert np.array_equal(weights[name], want), name
        assert (weights[name] == 0).mean() >= 0.55
    with torch.no_grad():
        want = m(x)
    _close(_ort(path, [x])[0], want)
    _close(_lopper(path, [x])[0], want)
    # The batch is dynamic.
    x5 = torch.randn(5, 3, 16, 16)
    with torch.no_grad():
        _close(_ort(path, [x5])[0], m(x5))


@pytest.mark.filterwarnings("ignore:.*torch.nn.utils.prune masks")
def test_a_transformers_model_as_it_comes(tmp_path):
    m = _tiny_llama()
    ids = torch.randint(1, 96, (2, 12))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    lopper.prune(m, inputs, method="wanda", amount=0.5, data=[inputs], progress=False)
    path = tmp_path / "llama.onnx"
    lopper.export_onnx(m, inputs, path)
    assert m.config.use_cache  # the model's own settings left as they were
    with torch.no_grad():
        want = m(**inputs, use_cache=False).logits
    _close(_ort(path, [ids, inputs["attention_mask"]])[0], want)
    _close(_lopper(path, [ids, inputs["attention_mask"]])[0], want)
    # Another batch size and length than the example's.
    ids3 = torch.randint(1, 96, (3, 7))
    with torch.no_grad():
        want3 = m(input_ids=ids3, attention_mask=torch.ones_like(ids3), use_cache=False).logits
    _close(_ort(path, [ids3, torch.ones_like(ids3)])[0], want3)


def test_buffers_are_named_and_lopper_train_leaves_them(tmp_path):
    """The module's buffers (BatchNorm's statistics, RoPE's inv_freq) are listed in the file's
    metadata, and `lopper finetune` trains the parameters only, as torch.optim does."""
    import json
    import subprocess

    from conftest import BUILD

    pytest.importorskip("transformers")  # before the CNN half, so the test skips whole
    m, x = _cnn()
    path = tmp_path / "cnn.onnx"
    lopper.export_onnx(m, x, path)
    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    assert {"1.running_mean", "1.running_var"} <= set(json.loads(meta["lopper.buffers"]))
    llama = _tiny_llama()
    ids = torch.randint(1, 96, (8, 12))
    path = tmp_path / "llama.onnx"
    lopper.export_onnx(llama, {"input_ids": ids[:2]}, path)
    before = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    buffers = json.loads({p.key: p.value for p in onnx.load(str(path)).metadata_props}["lopper.buffers"])
    inv_freq = [b for b in buffers if b.endswith("inv_freq")]
    assert inv_freq and all(b in before for b in inv_freq), buffers
    np.save(tmp_path / "ids.npy", ids.numpy())
    out = tmp_path / "f.onnx"
    r = subprocess.run([str(BUILD / "lopper"), "finetune", str(path), "--data", f"tokens:{tmp_path / 'ids.npy'}",
                        "-o", str(out), "--epochs", "1", "--batch-size", "4", "--lr", "0.01", "--no-eval"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    after = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    for b in inv_freq:
        assert np.array_equal(after[b], before[b]), b
    moved = [n for n in before if "proj" in n and not np.array_equal(after[n], before[n])]
    assert moved, "finetune trained nothing"


def test_an_existing_file_is_replaced_only_when_the_new_one_is_checked(tmp_path, monkeypatch):
    m, x = _cnn()
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    (tmp_path / "m.onnx.data").write_bytes(b"old data")
    monkeypatch.setattr(lopper_prune_module, "_same_outputs", lambda got, expected: False)
    with pytest.raises(RuntimeError, match=r"^\[export_onnx\] lopper's executor computes other "
                                           r"outputs .*nothing written"):
        lopper.export_onnx(m, x, path)
    assert path.read_bytes() == b"old" and (tmp_path / "m.onnx.data").read_bytes() == b"old data"
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    # Unchecked, it is written.
    lopper.export_onnx(m, x, path, check=False)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    monkeypatch.undo()
    lopper.export_onnx(m, x, path)
    with torch.no_grad():
        _close(_ort(path, [x])[0], m(x))


def test_bad_input_writes_nothing(tmp_path):
    from conftest import DataDependent

    m, x = _cnn()
    with pytest.raises(FileNotFoundError, match=r"^\[export_onnx\] the folder of .* does not "
                                                r"exist$"):
        lopper.export_onnx(m, x, tmp_path / "missing" / "m.onnx")
    with pytest.raises(TypeError, match=r"^\[export_onnx\] module must be a torch.nn.Module"):
        lopper.export_onnx("model", x, tmp_path / "m.onnx")
    with pytest.raises(TypeError, match=r"^\[export_onnx\] path must be a str or os.PathLike"):
        lopper.export_onnx(m, x, 3)
    with pytest.raises(TypeError, match=r"^\[export_onnx\] example_inputs must be"):
        lopper.export_onnx(m, 3, tmp_path / "m.onnx")
    with pytest.raises(RuntimeError, match=r"^\[export_onnx\] the module does not export to ONNX"):
        lopper.export_onnx(DataDependent(), torch.randn(2, 4), tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []


def test_public_name():
    assert "export_onnx" in lopper.__all__ and lopper.export_onnx.__doc__
