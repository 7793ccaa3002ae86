"""Makes the example models in examples/ (committed, so `make run` needs no export step).

All take "image" [batch,1,28,28] (Fashion-MNIST-shaped) and give "logits" [batch,10]; random init
with a fixed seed per model, eval mode, dynamic batch, exported with torch.onnx (TorchScript
exporter, opset 17). Initializers keep their nn.Sequential names ("1.weight", ...), which
bench/accuracy_torch.py relies on to load the same weights back into torch.

cnn_small.onnx:     a small CNN (two conv+BN+ReLU+pool blocks, 128-unit FC), seed 0.
lenet300_100.onnx:  LeNet-300-100 (Han et al. 2015): Flatten, 784-300-100-10 MLP with ReLU, seed 1.
lenet5.onnx:        LeNet-5 for 28x28: conv5x5(6, pad 2)-pool-conv5x5(16)-pool, 400-120-84-10 FC
                    with ReLU and max pooling, seed 2.
resnet_fmnist.onnx: a small ResNet for 28x28 (CIFAR-style ResNet-8): stem conv3x3(16)+BN+ReLU, three
                    stages of one BasicBlock each (16, 32, 64 channels; the last two stride 2, with
                    a 1x1 conv+BN shortcut), global average pool, Linear 64-10; 78 K params,
                    9.2 M MACs; seed 3. Exported with BatchNorm KEPT (TrainingMode.PRESERVE, no
                    constant folding) so `lopper train` trains its BatchNormalization nodes and
                    structured pruning meets the residual Adds that tie channels into groups
                    (bench/target_vs_uniform.py). Initializers carry the module names
                    ("stem.0.weight", "stage2.0.conv1.weight", ...).
Usage: .venv/bin/python examples/make_examples.py [NAME ...]   # default: all; e.g. resnet_fmnist
"""

import argparse
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


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: conv3x3-BN-ReLU-conv3x3-BN, + the input (or a 1x1 conv+BN of it
    when the shape changes), ReLU."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNetFMNIST(nn.Module):
    def __init__(self, widths=(16, 32, 64), blocks=1):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        cin = widths[0]
        stages = []
        for i, w in enumerate(widths):
            layers = []
            for b in range(blocks):
                layers.append(BasicBlock(cin, w, 2 if (i > 0 and b == 0) else 1))
                cin = w
            stages.append(nn.Sequential(*layers))
        self.stage1, self.stage2, self.stage3 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, 10)

    def forward(self, x):
        x = self.stage3(self.stage2(self.stage1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def export(model, name, keep_bn=False):
    out = os.path.join(HERE, name)
    kw = dict(training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False) if keep_bn else {}
    torch.onnx.export(model, (torch.randn(1, 1, 28, 28),), out, dynamo=False, opset_version=17,
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}}, **kw)
    print("wrote", out, os.path.getsize(out), "bytes")


def make_cnn_small():
    # NOTE: cnn_small keeps the original seed so the committed file is unchanged.
    torch.manual_seed(0)
    cnn_small = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    export(cnn_small, "cnn_small.onnx")


def make_lenet300_100():
    torch.manual_seed(1)
    export(lenet300_100().eval(), "lenet300_100.onnx")


def make_lenet5():
    torch.manual_seed(2)
    export(lenet5().eval(), "lenet5.onnx")


def make_resnet_fmnist():
    torch.manual_seed(3)
    export(ResNetFMNIST().eval(), "resnet_fmnist.onnx", keep_bn=True)


MODELS = {"cnn_small": make_cnn_small, "lenet300_100": make_lenet300_100, "lenet5": make_lenet5,
          "resnet_fmnist": make_resnet_fmnist}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME", help="models to write (default: all): " + ", ".join(MODELS))
    names = ap.parse_args().names or list(MODELS)
    for name in names:
        if name not in MODELS:
            ap.error(f"unknown model {name!r}; one of: {', '.join(MODELS)}")
    for name in names:
        MODELS[name]()


if __name__ == "__main__":
    main()
