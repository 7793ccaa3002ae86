"""Makes the example models in examples/ (committed, so `make run` needs no export step).

All take "image" [batch,1,28,28] (Fashion-MNIST-shaped) and give "logits" [batch,10]; random init
with a fixed seed per model, eval mode, dynamic batch, exported with torch.onnx (TorchScript
exporter, opset 17). Initializers keep their nn.Sequential names ("1.weight", ...), which
bench/accuracy_torch.py relies on to load the same weights back into torch.

cnn_small.onnx:     a small CNN (two conv+BN+ReLU+pool blocks, 128-unit FC), seed 0.
lenet300_100.onnx:  LeNet-300-100 (Han et al. 2015): Flatten, 784-300-100-10 MLP with ReLU, seed 1.
lenet5.onnx:        LeNet-5 for 28x28: conv5x5(6, pad 2)-pool-conv5x5(16)-pool, 400-120-84-10 FC
                    with ReLU and max pooling, seed 2.
Usage: .venv/bin/python examples/make_examples.py
"""

import os

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))


def lenet300_100():
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(),
        nn.Linear(100, 10))


def lenet5():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


def export(model, name):
    out = os.path.join(HERE, name)
    torch.onnx.export(model, (torch.randn(1, 1, 28, 28),), out, dynamo=False, opset_version=17,
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    print("wrote", out, os.path.getsize(out), "bytes")


def main():
    # NOTE: cnn_small keeps the original seed and call order so the committed file is unchanged.
    torch.manual_seed(0)
    cnn_small = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    export(cnn_small, "cnn_small.onnx")

    torch.manual_seed(1)
    export(lenet300_100().eval(), "lenet300_100.onnx")

    torch.manual_seed(2)
    export(lenet5().eval(), "lenet5.onnx")


if __name__ == "__main__":
    main()
