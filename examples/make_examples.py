"""Makes the example models in examples/ (committed, so `make run` needs no export step).

cnn_small.onnx: a small Fashion-MNIST-shaped CNN (1x28x28 -> 10 classes), random init (seed 0),
dynamic batch, exported with torch.onnx (TorchScript exporter, opset 17).
Usage: .venv/bin/python examples/make_examples.py
"""

import os

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cnn_small.onnx")
torch.onnx.export(model, (torch.randn(1, 1, 28, 28),), out, dynamo=False, opset_version=17,
                  input_names=["image"], output_names=["logits"],
                  dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
print("wrote", out, os.path.getsize(out), "bytes")
