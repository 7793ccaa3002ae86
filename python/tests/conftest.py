"""Shared fixtures of the Python package's tests.

Run by ctest (`python`, tests/CMakeLists.txt) with PYTHONPATH=BUILD/python and the environment
below; by hand: PYTHONPATH=build/python .venv/bin/python -m pytest python/tests
  LOPPER_FIXTURES_DIR  the models tests/fixtures/make_models.py wrote (default build/fixtures)
  LOPPER_BUILD_DIR     the CMake build folder (default build)
"""
import functools
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper

SOURCE = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("LOPPER_BUILD_DIR", SOURCE / "build"))
FIXTURES = Path(os.environ.get("LOPPER_FIXTURES_DIR", BUILD / "fixtures"))


def seeded(make):
    """`make` with torch seeded 0 first: the same model every call."""
    @functools.wraps(make)
    def wrapped(*a, **k):
        torch.manual_seed(0)
        return make(*a, **k)
    return wrapped


@seeded
def mlp():
    """A LeNet-300-100-like MLP on 28x28 inputs, and a batch of 4."""
    m = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                      nn.Linear(32, 10))
    return m, torch.randn(4, 1, 28, 28)


@seeded
def llama():
    """A tiny transformers LLaMA (2 layers, hidden 64, grouped-query heads) and an input."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, max_position_embeddings=32,
                                   attn_implementation="eager", use_cache=False)
    m = transformers.LlamaForCausalLM(cfg).eval()
    return m, {"input_ids": torch.randint(0, 200, (1, 12))}


class DataDependent(nn.Module):
    """A module torch.export cannot trace: its forward branches on the values of its input."""
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) if float(x.sum()) > 0 else -self.fc(x)


@pytest.fixture(scope="session")
def fixtures():
    if not (FIXTURES / "resnet18.ts.onnx").is_file():
        pytest.fail(f"no fixture models in {FIXTURES}: run ctest -R fixtures first")
    return FIXTURES


def multi_output_model():
    """x [batch, 4] float -> relu (Relu), neg (Neg), twice (x + x), same (x itself), const (an
    initializer): five outputs, two of them memory lopper does not own."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
            for n, s in [("relu", ["batch", 4]), ("neg", ["batch", 4]), ("twice", ["batch", 4]),
                         ("same", ["batch", 4]), ("const", [3])]]
    nodes = [helper.make_node("Relu", ["x"], ["relu"]), helper.make_node("Neg", ["x"], ["neg"]),
             helper.make_node("Add", ["x", "x"], ["twice"]),
             helper.make_node("Identity", ["x"], ["same"]),
             helper.make_node("Identity", ["c"], ["const"])]
    init = [helper.make_tensor("c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])]
    graph = helper.make_graph(nodes, "multi", [x], outs, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.fixture(scope="session")
def multi_output_bytes():
    return multi_output_model()


def assert_close(got, want, rtol=1e-4):
    """Within rtol of the reference's largest magnitude, elementwise."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    scale = max(float(np.abs(want).max()), 1e-6)
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    assert err <= rtol * scale, f"max |diff| {err:.3g} > {rtol} x {scale:.3g}"
