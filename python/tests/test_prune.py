"""lopper.prune on nn.Modules: the masks torch.nn.utils.prune computes (l1 local and global, a
second round), the zeros `lopper prune` writes for the same export, N:M, blocks, recipes (dict
and YAML), grad/taylor on the user's batches (against torch's own gradients), a training loop
that keeps the zeros, tied weights, progress, wanda/sparsegpt/OWL against the CLI (masks,
sparsegpt's updated weights, outputs against ONNX Runtime), and errors that leave the module
untouched."""
import copy
import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper
from torch.nn.utils import prune as torch_prune

import lopper
from conftest import BUILD, DataDependent, assert_close, llama, mlp, seeded
from lopper import _prune as lopper_prune_module


@seeded
def cnn():
    m = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 32), nn.ReLU(), nn.Linear(32, 10))
    for bn in (m[1], m[5]):  # trained-looking statistics, so eval mode differs from train mode
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
    return m, torch.randn(2, 1, 28, 28)


@seeded
def encoder():
    m = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    return m, torch.randn(2, 6, 32)


@seeded
def gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32,
                                  bos_token_id=0, eos_token_id=0, use_cache=False)
    cfg._attn_implementation = "eager"
    m = transformers.GPT2LMHeadModel(cfg)
    return m, {"input_ids": torch.randint(0, 100, (2, 8))}


def masks(module):
    """{parameter name: mask} of every torch.nn.utils.prune mask in the module."""
    return {name[:-len("_mask")]: b.detach().clone() for name, b in module.named_buffers()
            if name.endswith("_mask")}


def weights(module, names):
    out = {}
    for name in names:
        sub, _, attr = name.rpartition(".")
        out[name] = getattr(module.get_submodule(sub), attr)
    return out


def layers_of(module):
    return [(n, m) for n, m in module.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


def snapshot(module):
    """Everything a failed call must leave as it was."""
    return ({k: v.clone() for k, v in module.state_dict().items()},
            {n: (dict(m._forward_pre_hooks), m.training) for n, m in module.named_modules()},
            [n for n, _ in module.named_parameters()])


def assert_same(module, snap):
    state, hooks, params = snap
    now = snapshot(module)
    assert now[2] == params
    assert now[1] == hooks
    assert state.keys() == now[0].keys()
    for k in state:
        assert torch.equal(state[k], now[0][k]), k


def quiet_prune(*a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lopper.prune(*a, **k)


# --- (a) the masks torch.nn.utils.prune computes ------------------------------------------------


@pytest.mark.parametrize("make", [mlp, cnn])
@pytest.mark.parametrize("amount", [0.3, 0.5, 50])
def test_l1_local_is_torch_l1_unstructured(make, amount):
    m, x = make()
    ref = copy.deepcopy(m)
    report = lopper.prune(m, x, method="l1", amount=amount)
    for name, sub in layers_of(ref):
        torch_prune.l1_unstructured(sub, "weight", amount=amount)
    want, got = masks(ref), masks(m)
    assert got.keys() == want.keys() and len(got) == len(layers_of(ref))
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert all(l.skipped == "" for l in report.layers)
    for l in report.layers:
        assert l.nonzero == int(got[l.param].sum())


@pytest.mark.parametrize("make", [mlp, cnn, encoder])
@pytest.mark.parametrize("amount", [0.6, 5000])
def test_l1_global_is_torch_global_unstructured(make, amount):
    m, x = make()
    ref = copy.deepcopy(m)
    lopper.prune(m, x, method="l1", amount=amount, scope="global")
    names = sorted(masks(m))
    params = [(ref.get_submodule(n.rpartition(".")[0]), n.rpartition(".")[2]) for n in names]
    torch_prune.global_unstructured(params, pruning_method=torch_prune.L1Unstructured,
                                    amount=amount)
    want = masks(ref)
    assert sorted(want) == names
    for k in names:
        assert torch.equal(masks(m)[k], want[k]), k


def test_second_round_is_torch_pruning_container():
    m, x = mlp()
    ref = copy.deepcopy(m)
    lopper.prune(m, x, method="l1", amount=0.5)
    lopper.prune(m, x, method="l1", amount=0.5)
    for _, sub in layers_of(ref):
        torch_prune.l1_unstructured(sub, "weight", amount=0.5)
        torch_prune.l1_unstructured(sub, "weight", amount=0.5)
    for k, want in masks(ref).items():
        assert torch.equal(masks(m)[k], want), k
        assert abs(float(want.mean()) - 0.25) < 0.01
    # torch's own containers: one hook per weight, which lopper's second mask joined.
    for _, sub in layers_of(m):
        hooks = [h for h in sub._forward_pre_hooks.values()
                 if isinstance(h, torch_prune.BasePruningMethod)]
        assert len(hooks) == 1 and isinstance(hooks[0], torch_prune.PruningContainer)


def test_after_torchs_own_pruning():
    m, x = mlp()
    ref = copy.deepcopy(m)
    for mod in (m, ref):
        torch_prune.l1_unstructured(mod[1], "weight", amount=0.4)
        torch.manual_seed(1)
        torch_prune.random_unstructured(mod[3], "weight", amount=0.4)
    report = lopper.prune(m, x, method="l1", amount=0.5, scope="global")
    # The export sees the masked weights; amount counts from the weights left, as torch does.
    names = ["1.weight", "3.weight", "5.weight"]
    torch_prune.global_unstructured([(ref[1], "weight"), (ref[3], "weight"), (ref[5], "weight")],
                                    pruning_method=torch_prune.L1Unstructured, amount=0.5)
    for k in names:
        assert torch.equal(masks(m)[k], masks(ref)[k]), k
    assert report.layers[0].nonzero_before == 784 * 64 - round(0.4 * 784 * 64)


def test_weights_that_are_not_parameters_are_left_alone():
    class Buffered(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 8)
            self.register_buffer("proj", torch.randn(4, 8))

        def forward(self, x):
            return F.linear(self.fc(x), self.proj)

    torch.manual_seed(0)
    m = Buffered()
    report = lopper.prune(m, torch.randn(2, 16), method="l1", amount=0.5, scope="global")
    rows = {l.weight: l for l in report.layers}
    assert rows["proj"].skipped.startswith("not a parameter of the module")
    assert rows["fc.weight"].skipped == "" and set(masks(m)) == {"fc.weight"}
    m2 = Buffered()
    report = lopper.prune(m2, torch.randn(2, 16), recipe={"defaults": {"method": "l1",
                                                                       "amount": 0.5}})
    assert {l.weight: l.skipped for l in report.layers}["proj"].startswith("not a parameter")
    assert set(masks(m2)) == {"fc.weight"}


def test_abs_lamp_exclude_and_skip_first_last():
    m, x = mlp()
    lopper.prune(m, x, method="abs", threshold=0.02)
    for name, w in weights(mlp()[0], ["1.weight", "3.weight", "5.weight"]).items():
        assert torch.equal(masks(m)[name], (w.abs() >= 0.02).float()), name
    m, x = mlp()
    r = lopper.prune(m, x, method="lamp", amount=0.5, scope="global")
    assert r.nonzero == r.params // 2 and r.layers[0].method == "lamp global"
    m, x = mlp()
    r = lopper.prune(m, x, method="l1", amount=0.5, exclude=r"^3\.")
    assert set(masks(m)) == {"1.weight", "5.weight"}
    m, x = mlp()
    r = lopper.prune(m, x, method="l1", amount=0.5, skip_first_last=True)
    assert set(masks(m)) == {"3.weight"}
    assert [l.skipped.split(" (")[0] for l in r.layers] == ["first layer", "", "last layer"]


def test_amount_kinds_are_torchs():
    # numpy integers count weights, as torch's numbers.Integral check has it; floats are fractions.
    m, x = mlp()
    r = lopper.prune(m, x, method="l1", amount=np.int64(100))
    assert [l.params - l.nonzero for l in r.layers] == [100, 100, 100]
    m, x = mlp()
    r = lopper.prune(m, x, method="l1", amount=np.float32(0.25))
    assert [l.params - l.nonzero for l in r.layers] == [12544, 512, 80]


def test_report_table_and_dict():
    m, x = mlp()
    report = lopper.prune(m, x, method="l1", amount=0.5, scope="global")
    table = str(report)
    assert "1.weight" in table and "l1 global" in table and "sparsity" in table
    d = report.to_dict()
    assert [l["param"] for l in d["layers"]] == ["1.weight", "3.weight", "5.weight"]
    assert d["params"] == report.params == 784 * 64 + 64 * 32 + 32 * 10
    assert d["nonzero"] == report.nonzero == report.params // 2
    assert report.sparsity == pytest.approx(0.5, abs=1e-4)
    assert [l.param for l in report.layers] == ["1.weight", "3.weight", "5.weight"]
    assert report.layers[0].shape == [64, 784] and report.layers[0].op == "Gemm"
    assert "PruneReport(" in repr(report)


# --- (b) the zeros `lopper prune` writes for the same export ------------------------------------


CLI_CASES = [
    (cnn, dict(method="l1", amount=0.5, scope="global"), ["--scope", "global", "--amount", "0.5"]),
    (mlp, dict(method="l1", pattern="2:4"), ["--pattern", "2:4"]),
    (mlp, dict(method="random", amount=0.3, seed=3), ["--amount", "0.3", "--seed", "3"]),
    (mlp, dict(method="l1", amount=0.5, pattern="block:4x2"), ["--amount", "0.5", "--pattern",
                                                               "block:4x2"]),
    (encoder, dict(method="l1", amount=0.4, pattern="row", norm=2),
     ["--amount", "0.4", "--pattern", "row", "--norm", "2"]),
    (gpt2, dict(method="l1", amount=0.5, scope="global"), ["--scope", "global", "--amount", "0.5"]),
]


@pytest.mark.parametrize("make,kwargs,flags", CLI_CASES,
                         ids=["cnn-global", "mlp-2:4", "mlp-random", "mlp-block", "encoder-row",
                              "gpt2-global"])
def test_masks_are_what_the_cli_writes(tmp_path, make, kwargs, flags):
    cli = BUILD / "lopper"
    if not cli.is_file():
        pytest.skip(f"no {cli}")
    m, x = make()
    args, kw = lopper_prune_module._split_inputs(x)
    data, _ = lopper_prune_module._export(m, args, kw, dynamic=False)
    (tmp_path / "m.onnx").write_bytes(data)
    subprocess.run([str(cli), "prune", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "p.onnx"),
                    "--method", kwargs["method"], *flags], check=True, capture_output=True)
    written = {t.name: numpy_helper.to_array(t)
               for t in onnx.load(str(tmp_path / "p.onnx")).graph.initializer}
    quiet_prune(m, x, **kwargs)
    got = masks(m)
    assert got
    for name, mask in got.items():
        assert np.array_equal(mask.numpy() != 0, written[name] != 0), name


# --- (c) N:M ------------------------------------------------------------------------------------


def test_2_4_keeps_two_of_every_four_along_the_reduction_dim():
    m, x = mlp()
    report = lopper.prune(m, x, method="l1", pattern="2:4")
    for name, mask in masks(m).items():
        groups = mask.reshape(mask.shape[0], -1, 4).sum(-1)
        assert torch.all(groups == 2), name
    assert all(l.sparsity == 0.5 and l.method == "l1 2:4" for l in report.layers)


def test_2_4_on_conv_and_gpt2_layouts():
    m, x = cnn()
    quiet_prune(m, x, method="l1", pattern="2:4")
    got = masks(m)
    assert "0.weight" not in got  # the first conv's reduction dim, 1*3*3, is not a multiple of 4
    assert torch.all(got["4.weight"].reshape(16, -1, 4).sum(-1) == 2)
    # GPT-2's Conv1D holds its weight [in, out]: the reduction dim is the first.
    g, ids = gpt2()
    quiet_prune(g, ids, method="l1", pattern="2:4")
    w = masks(g)["transformer.h.0.mlp.c_fc.weight"]
    assert w.shape == (32, 128)
    assert torch.all(w.t().reshape(128, -1, 4).sum(-1) == 2)


# --- (d) blocks and recipes ---------------------------------------------------------------------


def test_block_masks_whole_blocks():
    m, x = mlp()
    report = lopper.prune(m, x, method="l1", amount=0.5, pattern="block:4x2")
    got = masks(m)
    for name in ["1.weight", "3.weight"]:  # whole blocks (5.weight [10, 32] has partial ones)
        o, i = got[name].shape
        blocks = got[name].reshape(o // 4, 4, i // 2, 2).sum((1, 3))
        assert torch.all((blocks == 0) | (blocks == 8)), name
        assert float(blocks.eq(0).float().mean()) == 0.5
    assert all(l.method == "l1 block:4x2 L1" for l in report.layers)


RECIPE = {
    "defaults": {"method": "l1", "amount": 0.5},
    "rules": [
        {"match": "^5\\.weight$", "skip": True},
        {"match": "^1\\.weight$", "pattern": "2:4"},
    ],
}


def test_recipe_dict_and_yaml(tmp_path):
    m, x = mlp()
    report = lopper.prune(m, x, recipe=RECIPE)
    got = masks(m)
    assert set(got) == {"1.weight", "3.weight"}
    assert not hasattr(m[5], "weight_mask")
    assert torch.all(got["1.weight"].reshape(64, -1, 4).sum(-1) == 2)
    ref = copy.deepcopy(mlp()[0])
    torch_prune.l1_unstructured(ref[3], "weight", amount=0.5)
    assert torch.equal(got["3.weight"], ref[3].weight_mask)
    rows = {l.param: l for l in report.layers}
    assert rows["5.weight"].skipped.endswith("skip")
    assert rows["1.weight"].rule.startswith("rules[1]")

    path = tmp_path / "recipe.yaml"
    path.write_text("defaults: {method: l1, amount: 0.5}\n"
                    "rules:\n"
                    "  - {match: '^5\\.weight$', skip: true}\n"
                    "  - {match: '^1\\.weight$', pattern: '2:4'}\n")
    m2, _ = mlp()
    lopper.prune(m2, x, recipe=path)
    assert masks(m2).keys() == got.keys()
    for k in got:
        assert torch.equal(masks(m2)[k], got[k]), k
    m3, _ = mlp()
    lopper.prune(m3, x, recipe=str(path))
    assert torch.equal(masks(m3)["3.weight"], got["3.weight"])


# --- (e) grad and taylor on the user's batches --------------------------------------------------


def batches(n=4, size=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 1, 28, 28, generator=g), torch.randint(0, 10, (size,), generator=g))
            for _ in range(n)]


def torch_scores(module, data, kind):
    """grad: mean over the batches of |dL/dw|; taylor: sum of |w * dL/dw| (cross-entropy, eval)."""
    module = copy.deepcopy(module).eval()
    out = {}
    for x, y in data:
        module.zero_grad()
        F.cross_entropy(module(x), y).backward()
        for name, sub in layers_of(module):
            g = sub.weight.grad
            term = g.abs() if kind == "grad" else (sub.weight.detach() * g).abs()
            out[name] = out.get(name, 0) + term
    if kind == "grad":
        out = {k: v / len(data) for k, v in out.items()}
    return out


@pytest.mark.parametrize("kind", ["grad", "taylor"])
def test_gradient_criteria_are_torchs_on_the_same_batches(kind):
    m, x = mlp()
    data = batches()
    scores = torch_scores(m, data, kind)
    ref = copy.deepcopy(m)
    l1 = copy.deepcopy(m)
    report = lopper.prune(m, x, method=kind, amount=0.5, data=data, progress=False)
    lopper.prune(l1, x, method="l1", amount=0.5)
    for name, sub in layers_of(ref):
        torch_prune.l1_unstructured(sub, "weight", amount=0.5, importance_scores=scores[name])
    got, want = masks(m), masks(ref)
    for k in want:
        assert torch.equal(got[k], want[k]), k
        assert not torch.equal(got[k], masks(l1)[k]), k
    assert all(abs(l.sparsity - 0.5) < 1e-3 for l in report.layers)


def test_gradient_data_forms():
    # Batches of different sizes, dicts of named inputs, an endless generator (calib_batches of it).
    m, x = mlp()
    read = []

    def endless():
        g = torch.Generator().manual_seed(2)
        while True:
            read.append(1)
            size = 8 if len(read) % 2 else 5
            yield {"input": torch.randn(size, 1, 28, 28, generator=g),
                   "labels": torch.randint(0, 10, (size,), generator=g)}

    report = lopper.prune(m, x, method="taylor", amount=0.3, data=endless(), calib_batches=3,
                          progress=False)
    assert len(read) == 3
    assert all(abs(l.sparsity - 0.3) < 1e-3 for l in report.layers)


def test_gradient_criteria_on_a_language_model():
    g, ids = gpt2()
    gen = torch.Generator().manual_seed(3)
    # Token batches of different lengths, no labels: next-token prediction (loss "auto").
    data = [{"input_ids": torch.randint(0, 100, (2, t), generator=gen)} for t in (8, 12, 6)]
    report = quiet_prune(g, ids, method="grad", amount=0.4, data=data, progress=False)
    pruned = [l for l in report.layers if not l.skipped]
    assert len(pruned) == 8  # lm_head is tied to the embedding: left alone
    assert all(abs(l.sparsity - 0.4) < 1e-3 for l in pruned)
    assert len(masks(g)) == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gradient_criteria_on_cuda():
    m, x = mlp()
    ref = copy.deepcopy(m)
    data = batches()
    m.cuda()
    lopper.prune(m, x.cuda(), method="taylor", amount=0.5, data=[(a.cuda(), b.cuda())
                                                                  for a, b in data])
    lopper.prune(ref, x, method="taylor", amount=0.5, data=data, device="cpu")
    for k, want in masks(ref).items():
        got = masks(m)[k]
        assert got.device.type == "cuda"
        # Gradients on another device may differ in the last bits: compare the kept shares.
        assert float(got.float().mean()) == float(want.float().mean())
        assert float((got.cpu() == want).float().mean()) > 0.98, k


def test_progress_lines_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    m, x = mlp()
    lopper.prune(m, x, method="grad", amount=0.3, data=batches(n=4))
    err = capsys.readouterr().err
    assert "calibrate 4/4  loss" in err and len(err.strip().splitlines()) <= 4


def test_progress_with_tqdm(capsys):
    pytest.importorskip("tqdm")
    m, x = mlp()
    lopper.prune(m, x, method="grad", amount=0.3, data=batches(n=3))
    err = capsys.readouterr().err
    assert "calibrate" in err and "3/3" in err


# --- (f) the user's training loop keeps the zeros; remove() makes them permanent ----------------


@pytest.mark.parametrize("make", [mlp, cnn])
def test_training_keeps_zeros_and_remove_makes_them_permanent(make):
    m, x = make()
    lopper.prune(m, x, method="l1", amount=0.7, scope="global")
    before = masks(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    m.train()
    g = torch.Generator().manual_seed(5)
    for _ in range(5):
        xb = torch.randn(8, 1, 28, 28, generator=g)
        yb = torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        F.cross_entropy(m(xb), yb).backward()
        opt.step()
    m(x)  # the hooks recompute each weight from its _orig and _mask
    for name, w in weights(m, before).items():
        assert torch.all(w[before[name] == 0] == 0), name
        assert torch.any(w[before[name] != 0] != 0), name
    for name, sub in layers_of(m):
        torch_prune.remove(sub, "weight")
    assert not masks(m)
    for name, w in weights(m, before).items():
        assert isinstance(w, nn.Parameter)
        assert int((w == 0).sum()) >= int((before[name] == 0).sum()), name


# --- tied weights -------------------------------------------------------------------------------


def test_tied_weight_left_alone_unless_allowed():
    g, ids = gpt2()
    with pytest.warns(UserWarning, match="tied with embedding"):
        lopper.prune(g, ids, method="l1", amount=0.5, scope="global", prune_head=True)
    assert "lm_head.weight" not in masks(g) and "transformer.wte.weight" not in masks(g)

    g, ids = gpt2()
    with pytest.warns(UserWarning):
        report = lopper.prune(g, ids, method="l1", amount=0.5, allow_tied=True, prune_head=True)
    got = masks(g)
    # One parameter, two holders: both masked alike, and both read the same pruned values.
    assert torch.equal(got["lm_head.weight"], got["transformer.wte.weight"])
    assert abs(float(got["lm_head.weight"].mean()) - 0.5) < 1e-3
    g(**ids)
    assert torch.equal(g.lm_head.weight, g.transformer.wte.weight)
    assert g.lm_head.weight_orig is g.transformer.wte.weight_orig
    assert all(not l.skipped for l in report.layers)


# --- (g, h) errors: lopper's one line, the module untouched -------------------------------------


BAD_ARGUMENTS = [
    (dict(method="l1", amount=1.5), "[prune] amount must be in [0, 1], got 1.5"),
    (dict(method="l1", amount=-3), "[prune] amount must be a count >= 0, got -3"),
    (dict(method="l1", amount=1000), "[prune] amount 1000 is more than the 320 left to prune"),
    (dict(method="nope", amount=0.5), "[prune] unknown method 'nope'"),
    (dict(method="l1", pattern="2:3"), "nothing left to prune"),
    (dict(method="l1", pattern="3:2"), "[prune] N:M needs 1 <= N < M, got 3:2"),
    (dict(method="l1", amount=0.5, pattern="diagonal"), "[prune] unknown pattern 'diagonal'"),
    (dict(method="l1", amount=0.5, scope="everywhere"), "unknown scope 'everywhere'"),
    (dict(method="l1", amount=0.5, pattern="row", scope="global"), "scope global ranks single"),
    (dict(method="l1"), "method l1 needs amount"),
    (dict(method="abs"), "method abs needs threshold"),
    (dict(method="abs", threshold=0.1, amount=0.5), "abs takes threshold, not amount"),
    (dict(method="grad", amount=0.5), "grad ranks weights by their gradients on data"),
    (dict(method="l1", amount=0.5, data=[torch.randn(2, 784)]), "data is for grad, taylor, wanda and sparsegpt only"),
    (dict(method="l1", amount=0.5, exclude="("), "exclude '(' is not a valid regex"),
    (dict(method="l1", amount=0.5, exclude="weight"), "nothing left to prune"),
    (dict(recipe={"defaults": {"method": "l1", "amount": 0.5}}, method="l1"),
     "recipe sets each layer's pruning: drop method"),
    (dict(recipe={"rules": [{"match": "x", "methd": "l1"}]}), "methd"),
    (dict(recipe="/nonexistent/recipe.yaml"), "/nonexistent/recipe.yaml"),
    (dict(method="grad", amount=0.5, data=[(torch.randn(2, 784), torch.zeros(2))]),
     "labels must be integers"),
    (dict(method="grad", amount=0.5, data=[]), "has no batch"),
    (dict(method="grad", amount=0.5, data=[torch.randn(2, 784)], calib_batches=0),
     "calib_batches must be >= 1"),
    (dict(method="grad", amount=0.5, data=[torch.randn(2, 784)], loss="hinge"), "hinge"),
    # wanda, sparsegpt, OWL
    (dict(method="sparsegpt", amount=0.5, block_size=0, data=[torch.randn(2, 784)]),
     "[prune] block_size must be in 1..1048576, got 0"),
    (dict(method="sparsegpt", amount=0.5, dampening=-1, data=[torch.randn(2, 784)]),
     "[prune] dampening must be > 0, got -1"),
    (dict(method="wanda", amount=0.5, owl_lambda=0.1),
     "[prune] OWL weighs each block by its outlier activations: give data"),
    (dict(method="l1", amount=0.5, owl_lambda=0.1), "OWL weighs each block"),
    (dict(method="wanda", amount=0.5, scope="global", data=[torch.randn(2, 784)]),
     "[prune] wanda compares weights within each layer: use scope local"),
    (dict(method="sparsegpt", amount=0.5, scope="global", data=[torch.randn(2, 784)]),
     "[prune] sparsegpt compares weights within each layer"),
    (dict(method="wanda", amount=0.5), "wanda ranks weights by the layers' inputs on data"),
    (dict(method="sparsegpt", amount=0.5, pattern="row", data=[torch.randn(2, 784)]),
     "[prune] method sparsegpt removes single weights: use pattern unstructured or N:M"),
    (dict(method="wanda", amount=100, data=[torch.randn(2, 784)]), "give it as a fraction"),
    (dict(method="wanda", amount=0.5, owl_lambda=-0.1, data=[torch.randn(2, 784)]),
     "owl_lambda must be > 0, got -0.1"),
    (dict(method="wanda", amount=0.5, owl_lambda=0.6, data=[torch.randn(2, 784)]),
     "OWL's amounts span amount +- lambda"),
    (dict(method="wanda", amount=0.5, owl_lambda=0.1, owl_m=0, data=[torch.randn(2, 784)]),
     "owl_m must be > 0"),
    (dict(method="wanda", pattern="2:4", owl_lambda=0.1, data=[torch.randn(2, 784)]),
     "OWL spreads a fraction of unstructured weights"),
    (dict(method="l1", amount=0.5, sequential=False), "sequential=False is for method wanda"),
    (dict(method="wanda", amount=0.5, data=[torch.randn(2, 784)], calib_batches=0),
     "calib_batches must be >= 1"),
    (dict(recipe={"defaults": {"method": "wanda", "amount": 0.5}}, block_size=64,
          data=[torch.randn(2, 784)]), "recipe sets each layer's pruning: drop block_size"),
]


@pytest.mark.parametrize("kwargs,message", BAD_ARGUMENTS)
def test_bad_arguments_are_value_errors(kwargs, message):
    m, x = mlp()
    snap = snapshot(m)
    with pytest.raises(ValueError) as e:
        lopper.prune(m, x, **kwargs)
    text = str(e.value)
    assert message in text and "\n" not in text and text.startswith("[")
    assert_same(m, snap)


BAD_TYPES = [
    dict(method="l1", amount="half"),
    dict(method="l1", amount=True),
    dict(method="l1", amount=0.5, norm="two"),
    dict(recipe=42),
    dict(method="grad", amount=0.5, data=[("not", "tensors")]),
    dict(method="grad", amount=0.5, data=5),
    dict(method="l1", amount=0.5, scope=5),
    dict(method="grad", amount=0.5, data=[torch.randn(2, 784)], calib_batches="3"),
    dict(method="sparsegpt", amount=0.5, data=[torch.randn(2, 784)], block_size=1.5),
    dict(method="sparsegpt", amount=0.5, data=[torch.randn(2, 784)], block_size=True),
    dict(method="sparsegpt", amount=0.5, data=[torch.randn(2, 784)], dampening="0.01"),
    dict(method="wanda", amount=0.5, data=[torch.randn(2, 784)], owl_lambda="0.1"),
    dict(method="wanda", amount=0.5, data=5),
]


@pytest.mark.parametrize("kwargs", BAD_TYPES)
def test_wrong_types_are_type_errors(kwargs):
    m, x = mlp()
    snap = snapshot(m)
    with pytest.raises((TypeError, ValueError)) as e:
        lopper.prune(m, x, **kwargs)
    assert str(e.value).startswith("[prune]") and "\n" not in str(e.value)
    assert_same(m, snap)


def test_model_problems_are_runtime_errors():
    m, x = mlp()
    snap = snapshot(m)
    # Batches the model cannot take: lopper's executor says so while calibrating.
    with pytest.raises(RuntimeError) as e:
        lopper.prune(m, x, method="grad", amount=0.5, data=[torch.randn(2, 3, 5, 5)],
                     progress=False)
    assert str(e.value).startswith("[") and "\n" not in str(e.value)
    assert_same(m, snap)

    u = DataDependent()
    snap = snapshot(u)
    with pytest.raises(RuntimeError, match=r"^\[prune\] the module does not export"):
        lopper.prune(u, torch.randn(2, 4), method="l1", amount=0.5)
    assert_same(u, snap)


def test_modes_are_put_back():
    m, x = cnn()
    m.train()
    m[1].eval()  # a frozen BatchNorm
    lopper.prune(m, x, method="l1", amount=0.2)
    assert m.training and not m[1].training and m[5].training


def test_not_a_module():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        lopper.prune(lambda x: x, torch.randn(2), method="l1", amount=0.5)


def test_save_html(tmp_path):
    import json
    import re
    m, x = mlp()
    report = quiet_prune(m, x, method="l1", amount=0.5, scope="global")
    assert report.params_before == sum(p.numel() for p in m.parameters())
    page = tmp_path / "r.html"
    report.save_html(page)
    body = re.search(r'<script type="application/json" id="lopper-data">(.*?)</script>',
                     page.read_text(), re.S).group(1)
    data = json.loads(body.replace("<\\/", "</"))
    assert data["format"] == "lopper.report/1" and data["kind"] == "prune"
    before, after = data["models"]
    assert before["label"] == "before" and after["label"] == "after"
    assert after["nonzero"] < before["nonzero"]
    assert data["command"].startswith("lopper.prune(Sequential, method='l1', amount=0.5")
    with pytest.raises(OSError):
        report.save_html(tmp_path / "missing" / "r.html")
    assert not (tmp_path / "missing").exists()


# --- (i) one-shot LLM pruning: wanda, sparsegpt, OWL on the user's batches ----------------------


def token_batches(n=16, t=12, seed=4):
    """n token sequences, one per batch, and the same as one int64 array (the CLI's tokens:)."""
    ids = torch.randint(0, 200, (n, t), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": ids[i:i + 1]} for i in range(n)], ids.numpy()


def sample_batches(n=16, seed=4):
    """mlp's inputs and labels, one sample per batch, and the same as arrays (the CLI's npy:)."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    return [(x[i:i + 1], y[i:i + 1]) for i in range(n)], (x.numpy(), y.numpy())


# NOTE: one sample per batch: lopper sums a batch's statistics in float32 and the batches in
# float64, so the CLI's shuffled order of the same samples gives the same statistics, and the same
# masks and weights (--calib-batches: all of them).
# A transformers model is pruned in place through its own blocks, lm_head left alone: the CLI's
# --exclude lm_head on its export.
ONE_SHOT_CASES = [
    (llama, None, dict(method="wanda", amount=0.5), ["--amount", "0.5", "--exclude", "lm_head"]),
    (llama, None, dict(method="sparsegpt", amount=0.5),
     ["--amount", "0.5", "--exclude", "lm_head"]),
    (llama, None, dict(method="wanda", amount=0.5, owl_lambda=0.1, owl_m=3),
     ["--amount", "0.5", "--owl-lambda", "0.1", "--owl-m", "3", "--exclude", "lm_head"]),
    # Pruned before (masks held): sparsegpt's values go into weight_orig.
    (mlp, dict(method="l1", amount=0.3),
     dict(method="sparsegpt", pattern="2:4", block_size=16, dampening=0.05, sequential=False),
     ["--pattern", "2:4", "--block-size", "16", "--dampening", "0.05", "--one-pass"]),
]


@pytest.mark.parametrize("make,first,kwargs,flags", ONE_SHOT_CASES,
                         ids=["llama-wanda", "llama-sparsegpt", "llama-wanda-owl",
                              "mlp-sparsegpt-2:4-again"])
def test_one_shot_is_what_the_cli_writes(tmp_path, make, first, kwargs, flags):
    cli = BUILD / "lopper"
    if not cli.is_file():
        pytest.skip(f"no {cli}")
    m, x = make()
    if first:
        lopper.prune(m, x, **first)
    if make is llama:
        data, ids = token_batches()
        np.save(tmp_path / "ids.npy", ids)
        spec = f"tokens:{tmp_path / 'ids.npy'}"
    else:
        data, (xs, ys) = sample_batches()
        np.save(tmp_path / "x.npy", xs)
        np.save(tmp_path / "y.npy", ys)
        spec = f"npy:{tmp_path / 'x.npy'},{tmp_path / 'y.npy'}"
    args, kw = lopper_prune_module._split_inputs(x)
    exported, _ = lopper_prune_module._export(m, args, kw, dynamic=True)
    (tmp_path / "m.onnx").write_bytes(exported)
    subprocess.run([str(cli), "prune", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "p.onnx"),
                    "--method", kwargs["method"], *flags, "--data", spec, "--batch-size", "1",
                    "--calib-batches", str(len(data))], check=True, capture_output=True)
    written = {t.name: numpy_helper.to_array(t)
               for t in onnx.load(str(tmp_path / "p.onnx")).graph.initializer}
    before = {k: v.detach().clone() for k, v in m.state_dict().items()}

    report = quiet_prune(m, x, data=data, progress=False, **kwargs)  # 128 samples: all 16
    got = masks(m)
    pruned = [l.param for l in report.layers if not l.skipped]
    assert sorted(got) == sorted(pruned) and got
    assert "lm_head.weight" not in got
    for name, mask in got.items():
        assert np.array_equal(mask.numpy() != 0, written[name] != 0), name
    # The weights as the module computes them (<name>_orig * <name>_mask): lopper's.
    for name in got:
        sub, _, attr = name.rpartition(".")
        sub = m.get_submodule(sub)
        w = (getattr(sub, attr + "_orig") * getattr(sub, attr + "_mask")).detach().numpy()
        np.testing.assert_allclose(w, written[name], rtol=0, atol=1e-6, err_msg=name)
        orig = before[name + "_orig" if first else name]
        kept = getattr(sub, attr + "_mask").bool()
        if kwargs["method"] == "sparsegpt":  # the kept weights changed, in the parameter
            assert not torch.equal(getattr(sub, attr + "_orig")[kept], orig[kept]), name
        else:  # wanda only masks
            assert torch.equal(getattr(sub, attr + "_orig"), orig), name

    # The module computes what ONNX Runtime computes on the CLI's file.
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(tmp_path / "p.onnx"), providers=["CPUExecutionProvider"])
    feed = dict(zip([i.name for i in sess.get_inputs()],
                    [t.numpy() for t in (x.values() if isinstance(x, dict) else [x])]))
    want = sess.run(None, feed)[0]
    with torch.no_grad():
        out = m(**x) if isinstance(x, dict) else m(x)
    assert_close((out.logits if hasattr(out, "logits") else out).numpy(), want, rtol=1e-4)


def test_one_shot_batches_read():
    # Without calib_batches, the papers' 128 samples: 16 batches of 8 from an endless generator.
    read = []

    def endless(size=8):
        g = torch.Generator().manual_seed(2)
        while True:
            read.append(1)
            yield torch.randn(size, 1, 28, 28, generator=g)

    m, x = mlp()
    lopper.prune(m, x, method="wanda", amount=0.5, data=endless(), progress=False)
    assert len(read) == 16
    read.clear()
    m2, _ = mlp()
    lopper.prune(m2, x, method="wanda", amount=0.5, data=endless(), calib_batches=3,
                 progress=False)
    assert len(read) == 3
    # A last batch smaller than the first (a DataLoader's remainder) is left out, as the CLI's
    # drop_last does.
    g = torch.Generator().manual_seed(3)
    full = [torch.randn(8, 1, 28, 28, generator=g) for _ in range(2)]
    rest = torch.randn(3, 1, 28, 28, generator=g) * 10
    a, _ = mlp()
    b, _ = mlp()
    c, _ = mlp()
    lopper.prune(a, x, method="wanda", amount=0.5, data=full + [rest], progress=False)
    lopper.prune(b, x, method="wanda", amount=0.5, data=full, progress=False)
    lopper.prune(c, x, method="wanda", amount=0.5, data=full + [rest, rest], progress=False)
    assert all(torch.equal(masks(a)[k], masks(b)[k]) for k in masks(b))
    assert any(not torch.equal(masks(c)[k], masks(b)[k]) for k in masks(b))


def test_one_shot_progress_names_the_blocks(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    m, x = llama()
    data, _ = token_batches(n=2)
    report = quiet_prune(m, x, method="sparsegpt", pattern="2:4", data=data)
    err = capsys.readouterr().err
    assert "calibrate" in err and "model.layers.1" in err
    assert all(l.method == "sparsegpt 2:4" for l in report.layers if not l.skipped)
    for name, mask in masks(m).items():  # 2:4 along the reduction dim (Linear: [out, in])
        assert torch.all(mask.reshape(mask.shape[0], -1, 4).sum(-1) == 2), name


class _Logits(nn.Module):
    """A transformers model inside a plain module: lopper.prune exports it, as any module."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids).logits


def test_sequential_calibration_reaches_every_layer():
    # On the export, a block starts at the Transpose that hands its first layer's weight on, not
    # at the layer.
    m, x = llama()
    data, _ = token_batches(n=2)
    report = quiet_prune(_Logits(m), x, method="wanda", amount=0.5, data=data, progress=False)
    assert report.macs_before is not None  # the export's
    assert [l.param for l in report.layers if l.skipped] == []
