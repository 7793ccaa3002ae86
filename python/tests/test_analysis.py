"""lopper.sensitivity and lopper.prune_to_target on nn.Modules: the sweep against the module's own
losses (unpruned, and one layer pruned by torch.nn.utils.prune, or by lopper.prune with wanda and
sparsegpt), the module left untouched, targets on parameters, MACs and latency met and applied as
torch.nn.utils.prune masks (and sparsegpt's updated weights), the HTML page, errors of both kinds,
the GIL released during the sweep, and progress."""
import copy
import itertools
import json
import sys
import threading
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import prune as torch_prune

import lopper
from conftest import DataDependent, mlp, seeded
from lopper import _prune as lopper_prune_module

AMOUNTS = [0.25, 0.5, 0.9]


@seeded
def cnn():
    m = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10))
    for bn in (m[1], m[5]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return m, torch.randn(2, 1, 28, 28)


def batches(n=3, size=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 1, 28, 28, generator=g), torch.randint(0, 10, (size,), generator=g))
            for _ in range(n)]


def own_loss_and_top1(m, data):
    """The module's mean cross-entropy and top-1 over the samples of `data`, in eval mode."""
    m.eval()
    total, hit, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in data:
            out = m(x)
            total += float(F.cross_entropy(out, y, reduction="sum"))
            hit += int((out.argmax(1) == y).sum())
            n += len(y)
    return total / n, hit / n


def snapshot(m):
    return ({k: v.detach().clone() for k, v in m.state_dict().items()},
            [(type(h).__name__) for s in m.modules() for h in s._forward_pre_hooks.values()],
            [s.training for s in m.modules()])


def assert_same(m, snap):
    state, hooks, modes = snap
    now = m.state_dict()
    assert list(now) == list(state)
    for k, v in state.items():
        assert torch.equal(now[k], v) and now[k].dtype == v.dtype, k
    assert [type(h).__name__ for s in m.modules() for h in s._forward_pre_hooks.values()] == hooks
    assert [s.training for s in m.modules()] == modes


def effective_nonzero(m):
    """Nonzero parameters of a module as it computes: a masked weight counts as weight_orig *
    weight_mask."""
    n = 0
    for sub in m.modules():
        for name, p in sub.named_parameters(recurse=False):
            if name.endswith("_orig"):
                p = getattr(sub, name[:-5])
            n += int(p.count_nonzero())
    return n


def one_line(e, *parts):
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("["), msg
    for p in parts:
        assert p in msg, msg
    return msg


@pytest.fixture(scope="module")
def sweep():
    """One sweep of the MLP, shared by the tests that only read it."""
    m, x = mlp()
    data = batches()
    snap = snapshot(m)
    report = lopper.sensitivity(m, x, itertools.cycle(data), amounts=AMOUNTS, eval_batches=3,
                                progress=False)
    return m, x, data, snap, report


# --- sensitivity ----------------------------------------------------------------------------------


def test_sensitivity_measures_the_modules_own_losses(sweep):
    m, x, data, snap, report = sweep
    assert isinstance(report, lopper.SensitivityReport)
    assert report.unit == "weight" and report.method == "l1"
    assert [l.param for l in report.layers] == ["1.weight", "3.weight", "5.weight"]
    for layer in report.layers:
        assert [p.amount for p in layer.points] == AMOUNTS
        assert layer.label == layer.param
    assert [l.params for l in report.layers] == [784 * 64, 64 * 32, 32 * 10]
    # The endless iterable was read for three batches only, the same ones at every point.
    assert report.samples == 48
    loss, top1 = own_loss_and_top1(copy.deepcopy(m), data)
    assert report.loss == pytest.approx(loss, rel=1e-4)
    assert report.top1 == pytest.approx(top1, abs=1e-9)
    # One point against torch.nn.utils.prune's l1_unstructured on a copy.
    for i, amount in [(1, 0.5), (2, 0.9)]:
        pruned = copy.deepcopy(m)
        torch_prune.l1_unstructured(pruned[2 * i + 1], "weight", amount=amount)
        want_loss, want_top1 = own_loss_and_top1(pruned, data)
        point = report.layers[i].points[AMOUNTS.index(amount)]
        assert point.loss == pytest.approx(want_loss, rel=1e-4), (i, amount)
        assert point.top1 == pytest.approx(want_top1, abs=1e-9)
        assert point.removed == pytest.approx(amount, abs=1e-3)
        assert point.params == report.params - round(amount * report.layers[i].params)
    # The module is untouched: parameters, buffers, hooks and modes.
    assert_same(m, snap)


def test_sensitivity_table_and_json(sweep):
    _, _, _, _, report = sweep
    text = str(report)
    assert text.startswith("top-1 with one layer pruned alone by l1 (unpruned:")
    for name in ("1.weight", "3.weight", "5.weight", "0.25", "0.5", "0.9"):
        assert name in text
    assert len(text.strip().splitlines()) == 2 + 3
    d = report.to_dict()
    assert d["format"] == "lopper.sensitivity/1" and d["unit"] == "weight"
    assert d["base"]["loss"] == pytest.approx(report.loss)
    assert [l["param"] for l in d["layers"]] == ["1.weight", "3.weight", "5.weight"]
    assert [p["amount"] for p in d["layers"][0]["points"]] == AMOUNTS
    json.dumps(d)
    assert repr(report).startswith("SensitivityReport(unit='weight', layers=3")


ONE_SHOT = [("wanda", {}), ("sparsegpt", dict(calib_batches=2, block_size=16, dampening=0.05))]


@pytest.mark.parametrize("method,options", ONE_SHOT, ids=[m for m, _ in ONE_SHOT])
def test_one_shot_sensitivity_is_lopper_prune_of_one_layer(sweep, method, options):
    """Each point of a wanda or sparsegpt sweep is the module with that layer alone pruned by
    lopper.prune with the same method, options and data (the other layers excluded), evaluated."""
    m, x = mlp()
    data = batches()
    snap = snapshot(m)
    report = lopper.sensitivity(m, x, data, method=method, amounts=[0.5, 0.9], eval_batches=3,
                                progress=False, **options)
    assert report.method == method and report.skipped == []
    assert [l.param for l in report.layers] == ["1.weight", "3.weight", "5.weight"]
    assert report.samples == 48
    assert_same(m, snap)
    names = [l.param for l in report.layers]
    # One point per layer (each export takes a while), both amounts among them.
    for i, layer in enumerate(report.layers):
        point = layer.points[i % 2]
        others = "|".join(n.replace(".", r"\.") for n in names if n != layer.param)
        pruned = copy.deepcopy(m)
        lopper.prune(pruned, x, method=method, amount=point.amount, data=data,
                     exclude=f"^({others})$", progress=False, **options)
        want_loss, want_top1 = own_loss_and_top1(pruned, data)
        assert point.loss == pytest.approx(want_loss, rel=1e-4), (layer.param, point.amount)
        assert point.top1 == pytest.approx(want_top1, abs=1e-9)
        assert point.params == effective_nonzero(pruned)
    # Not l1's curves: the method (and its options) reached the sweep.
    l1 = sweep[4]
    assert report.loss == pytest.approx(l1.loss)
    pairs = [(p.loss, q.loss) for a, b in zip(report.layers, l1.layers)
             for p in a.points for q in b.points if p.amount == q.amount]
    assert len(pairs) == 6
    assert any(p != pytest.approx(q, rel=1e-6) for p, q in pairs), pairs


def test_structured_sensitivity_leaves_the_module_alone():
    m, x = cnn()
    snap = snapshot(m)
    report = lopper.sensitivity(m, x, batches(n=2, size=8), structured=True, amounts=[0.5],
                                eval_batches=2, progress=False)
    assert report.unit == "channel"
    assert report.layers and all(l.name.startswith("group ") and l.group >= 0
                                 for l in report.layers)
    assert all(len(l.points) == 1 and 0 < l.points[0].removed <= 0.5 for l in report.layers)
    assert "channel group" in str(report)
    assert_same(m, snap)


# --- prune_to_target ------------------------------------------------------------------------------


def test_params_target_is_met_with_torch_masks():
    m, x = mlp()
    before = effective_nonzero(m)
    want = m(x).detach()
    report = lopper.prune_to_target(m, x, params=0.5, progress=False)
    assert isinstance(report, lopper.TargetReport)
    assert report.kind == "params" and report.estimator == "lamp"
    after = effective_nonzero(m)
    assert report.nonzero_before == before and report.nonzero == after
    assert after <= 0.5 * before and after > 0.45 * before
    assert report.measured == after and report.goal == pytest.approx(0.5 * before)
    # torch.nn.utils.prune's own masks on every layer the target chose an amount for.
    for i, param in [(1, "1.weight"), (3, "3.weight"), (5, "5.weight")]:
        layer = m[i]
        assert isinstance(layer.weight_mask, torch.Tensor) and hasattr(layer, "weight_orig")
        hooks = [h for h in layer._forward_pre_hooks.values()
                 if isinstance(h, torch_prune.BasePruningMethod)]
        assert len(hooks) == 1
        chosen = next(u for u in report.layers if u.param == param)
        kept = float(layer.weight_mask.mean())
        assert kept == pytest.approx(1 - chosen.amount, abs=1e-6)
        assert torch.equal(layer.weight, layer.weight_orig * layer.weight_mask)
    assert m(x).shape == want.shape
    kept = int(m[1].weight_mask.sum())
    torch_prune.remove(m[1], "weight")
    assert not hasattr(m[1], "weight_mask") and int(m[1].weight.count_nonzero()) == kept
    text = str(report)
    assert "target   params 0.5 of" in text and "1.weight" in text
    d = report.to_dict()
    assert d["target"]["kind"] == "params" and d["target"]["value"] == 0.5
    assert d["nonzero"] == after and d["structured"] is False


def test_structured_macs_target_shrinks_the_module():
    m, x = cnn()
    want = m(x).shape
    report = lopper.prune_to_target(m, x, macs=0.5, structured=True, progress=False)
    assert m(x).shape == want
    d = report.to_dict()
    assert d["structured"] is True
    assert report.macs <= 0.5 * report.macs_before * 1.001
    # The module itself shrank: its convolutions have fewer filters and agree with their weights.
    assert m[0].out_channels < 8 or m[4].out_channels < 16
    for mod in m.modules():
        if isinstance(mod, nn.Conv2d):
            assert mod.weight.shape[0] == mod.out_channels
            assert mod.weight.shape[1] == mod.in_channels
        if isinstance(mod, nn.BatchNorm2d):
            assert mod.running_mean.shape[0] == mod.num_features


def test_structured_target_with_sensitivity_data():
    m, x = cnn()
    data = [(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))) for _ in range(2)]
    sens = lopper.sensitivity(m, x, data, structured=True, amounts=[0.3, 0.6, 0.9],
                            progress=False)
    report = lopper.prune_to_target(m, x, params=0.6, structured=True, sensitivity=sens,
                                    progress=False)
    assert sum(p.numel() for p in m.parameters()) < sum(
        p.numel() for p in cnn()[0].parameters())
    assert report.to_dict()["target"]["estimator"] == "sensitivity"


def test_macs_target_with_sensitivity(sweep):
    m0, x, data, _, sens = sweep
    m = copy.deepcopy(m0)
    report = lopper.prune_to_target(m, x, macs=0.5, sensitivity=sens, progress=False)
    assert report.estimator == "sensitivity" and report.sensitivity is sens
    assert report.base_loss == pytest.approx(sens.loss)
    assert report.measured_loss is None  # no data: nothing measured
    # MACs on nonzero weights at the example's batch of 4, counted here from the masks.
    macs = sum(4 * layer.in_features * layer.out_features * float(layer.weight_mask.mean())
               for layer in (m[1], m[3], m[5]))
    dense = 4 * (784 * 64 + 64 * 32 + 32 * 10)
    assert report.before == dense and report.macs_before == dense
    assert report.measured == pytest.approx(macs, abs=2)
    assert report.measured <= 0.5 * dense
    assert "est. loss +" in str(report)


def test_one_export_serves_a_sweep_and_its_target(monkeypatch):
    """lopper.sensitivity, then lopper.prune_to_target with its report on the same module: one
    export. A module whose tensors change (masks, an in-place update) or whose layers do is
    exported anew, and measured as it is now."""
    calls = []
    real = lopper_prune_module._export_model
    monkeypatch.setattr(lopper_prune_module, "_export_model",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    m, x = mlp()
    data = batches()
    sens = lopper.sensitivity(m, x, data, amounts=AMOUNTS, eval_batches=3, progress=False)
    lopper.prune_to_target(m, x, params=0.5, sensitivity=sens, progress=False)
    assert len(calls) == 1
    lopper.sensitivity(m, x, data, amounts=AMOUNTS, eval_batches=3, progress=False)
    assert len(calls) == 2  # masked now

    m, x = mlp()
    first = lopper.sensitivity(m, x, data, amounts=AMOUNTS, eval_batches=3, progress=False)
    with torch.no_grad():
        m[1].bias.add_(1.0)
    changed = lopper.sensitivity(m, x, data, amounts=AMOUNTS, eval_batches=3, progress=False)
    assert len(calls) == 4
    assert changed.loss == pytest.approx(own_loss_and_top1(m, data)[0], rel=1e-4)
    assert changed.loss != pytest.approx(first.loss, rel=1e-4)
    m[2] = nn.Tanh()
    tanh = lopper.sensitivity(m, x, data, amounts=AMOUNTS, eval_batches=3, progress=False)
    assert len(calls) == 5
    assert tanh.loss == pytest.approx(own_loss_and_top1(m, data)[0], rel=1e-4)
    m[2] = nn.LeakyReLU(0.5)
    lopper.sensitivity(m, x, data, amounts=AMOUNTS, eval_batches=3, progress=False)
    m[2] = nn.LeakyReLU(0.1)  # the same layer but for its slope
    leaky = lopper.sensitivity(m, x, data, amounts=AMOUNTS, eval_batches=3, progress=False)
    assert len(calls) == 7
    assert leaky.loss == pytest.approx(own_loss_and_top1(m, data)[0], rel=1e-4)


def test_target_with_data_measures_the_pruned_module():
    m, x = mlp()
    data = batches(n=2)
    report = lopper.prune_to_target(m, x, params=0.4, data=data, eval_batches=2, progress=False)
    assert report.estimator == "sensitivity"
    assert isinstance(report.sensitivity, lopper.SensitivityReport)
    assert len(report.sensitivity.layers[0].points) == 12
    loss, top1 = own_loss_and_top1(m, data)
    assert report.measured_loss == pytest.approx(loss, rel=1e-4)
    assert report.measured_top1 == pytest.approx(top1, abs=1e-9)
    assert effective_nonzero(m) <= 0.4 * report.nonzero_before
    d = report.to_dict()
    assert d["target"]["loss"]["measured"] == pytest.approx(loss, rel=1e-4)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_one_shot_target_prunes_by_its_method(method):
    """A wanda or sparsegpt target chooses amounts on its own curves (measured on data), then
    prunes the module by it; sparsegpt's updated weights are copied into the parameters, so the
    module computes what lopper measured of its pruned export."""
    m, x = mlp()
    original = copy.deepcopy(m)
    data = batches()
    report = lopper.prune_to_target(m, x, params=0.5, method=method, data=data, eval_batches=3,
                                    progress=False)
    assert report.estimator == "sensitivity" and report.sensitivity.method == method
    assert report.sensitivity.skipped == []
    after = effective_nonzero(m)
    assert report.nonzero == after and after <= 0.5 * report.nonzero_before
    loss, top1 = own_loss_and_top1(m, data)
    assert report.measured_loss == pytest.approx(loss, rel=1e-5)
    assert report.measured_top1 == pytest.approx(top1, abs=1e-9)
    changed = False
    for i in (1, 3, 5):
        layer = m[i]
        assert torch.equal(layer.weight, layer.weight_orig * layer.weight_mask)
        kept = layer.weight_mask.bool()
        changed |= not torch.equal(layer.weight_orig[kept], original[i].weight[kept])
    assert changed == (method == "sparsegpt")
    if method == "sparsegpt":
        # Without the new values (the original weights, masked) the module computes otherwise.
        masked = copy.deepcopy(original)
        for i in (1, 3, 5):
            torch_prune.custom_from_mask(masked[i], "weight", m[i].weight_mask)
        assert own_loss_and_top1(masked, data)[0] != pytest.approx(loss, rel=1e-5)


def test_one_shot_target_with_sensitivity_calibrates_on_data():
    m, x = mlp()
    data = batches(n=2)
    sens = lopper.sensitivity(m, x, data, method="sparsegpt", amounts=[0.3, 0.6, 0.9],
                              eval_batches=2, progress=False)
    snap = snapshot(m)
    # The sensitivity is sparsegpt's: a wanda target refuses it before touching the module.
    with pytest.raises(ValueError) as e:
        lopper.prune_to_target(m, x, params=0.5, method="wanda", sensitivity=sens, data=data,
                               progress=False)
    one_line(e, "[prune] the sensitivity was measured with method sparsegpt, the target prunes "
                "with wanda")
    assert_same(m, snap)
    report = lopper.prune_to_target(m, x, params=0.5, method="sparsegpt", sensitivity=sens,
                                    data=data, block_size=64, progress=False)
    assert report.sensitivity is sens and report.measured_loss is None
    assert effective_nonzero(m) <= 0.5 * report.nonzero_before
    assert report.to_dict()["target"]["estimator"] == "sensitivity"


def test_one_shot_target_refuses_an_l1_sensitivity(sweep):
    m0, x, data, _, l1 = sweep
    m = copy.deepcopy(m0)
    snap = snapshot(m)
    for method in ("wanda", "sparsegpt"):
        with pytest.raises(ValueError) as e:
            lopper.prune_to_target(m, x, params=0.5, method=method, sensitivity=l1, data=data,
                                   progress=False)
        one_line(e, f"[prune] the sensitivity was measured with method l1, the target prunes "
                    f"with {method}: measure it with lopper.sensitivity(..., method=\"{method}\")")
        assert_same(m, snap)


def test_latency_target_runs():
    m, x = mlp()
    report = lopper.prune_to_target(m, x, latency_ms=1000.0, progress=False)
    assert report.kind == "latency-ms" and report.goal == 1000.0
    assert 0 < report.before < 1000.0 and report.measured == report.before
    assert report.to_dict()["target"]["device"] == "cpu"
    assert "ms" in str(report)


# --- the HTML page --------------------------------------------------------------------------------


def page_data(path):
    """The data a report page draws (its <script id="lopper-data">)."""
    text = path.read_text()
    start = text.index('<script type="application/json" id="lopper-data">')
    start = text.index(">", start) + 1
    return json.loads(text[start:text.index("</script>", start)].replace("<\\/", "</"))


def test_save_html(sweep, tmp_path):
    m0, x, _, _, sens = sweep
    page = tmp_path / "sensitivity.html"
    sens.save_html(page)
    data = page_data(page)
    assert data["format"] == "lopper.report/1" and data["kind"] == "sensitivity"
    assert data["title"] == "Sensitivity of Sequential"
    [model] = data["models"]
    assert model["params"] == sens.params and model["top1"] == pytest.approx(sens.top1)
    assert model["latency_ms"] > 0 and model["macs"] == sens.macs
    assert [l["param"] for l in data["sensitivity"]["layers"]] == ["1.weight", "3.weight",
                                                                  "5.weight"]
    report = lopper.prune_to_target(copy.deepcopy(m0), x, params=0.5, sensitivity=sens,
                                    progress=False)
    report.save_html(str(tmp_path / "target.html"))
    data = page_data(tmp_path / "target.html")
    assert data["kind"] == "prune" and data["command"].startswith(
        "lopper.prune_to_target(Sequential, params=0.5, sensitivity=<SensitivityReport>")
    before, after = data["models"]
    assert before["nonzero"] == report.nonzero_before and after["nonzero"] == report.nonzero
    assert data["target"]["kind"] == "params" and data["target"]["value"] == 0.5
    assert [c["name"] for c in data["chosen"]] == ["1.weight", "3.weight", "5.weight"]
    assert "sensitivity" in data
    # No folder, or a folder of that name: an OSError, and nothing left behind.
    listing = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OSError) as e:
        sens.save_html(tmp_path / "no" / "such" / "page.html")
    one_line(e, "page.html")
    (tmp_path / "folder.html").mkdir()
    with pytest.raises(OSError):
        report.save_html(tmp_path / "folder.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(listing + ["folder.html"])
    assert list((tmp_path / "folder.html").iterdir()) == []


# --- errors ---------------------------------------------------------------------------------------

BAD_TARGETS = [
    (dict(params=0.5, macs=0.5), "one target"),
    (dict(), "one target"),
    (dict(params=1.5), "params is the share kept, in (0, 1), got 1.5"),
    (dict(latency_ms=-1.0), "latency_ms must be > 0"),
    (dict(params=0.5, method="nope"), "unknown method 'nope'"),
    (dict(params=0.5, method="random"),
     "a target prunes weights by l1, wanda or sparsegpt; method random does not go with it"),
    (dict(params=0.5, method="taylor", data=[torch.randn(2, 784)]), "method taylor does not go"),
    (dict(params=0.5, method="wanda"), "a target with method wanda calibrates on the layers' "
     "inputs: give data"),
    (dict(params=0.5, calib_batches=2),
     "calib_batches is for a target with method wanda and sparsegpt"),
    (dict(params=0.5, method="wanda", data=[torch.randn(2, 784)], block_size=16),
     "block_size is for a target with method sparsegpt, not wanda"),
    (dict(params=0.5, structured=True, dampening=0.1),
     "dampening is for a target with method sparsegpt"),
    (dict(params=0.5, method="sparsegpt", data=[torch.randn(2, 784)], dampening=0.0),
     "dampening must be > 0"),
    (dict(params=0.5, method="sparsegpt", data=[torch.randn(2, 784)], block_size=0),
     "block_size must be in 1.."),
    (dict(params=0.5, method="wanda", data=[torch.randn(2, 784)], calib_batches=0),
     "calib_batches must be >= 1"),
    (dict(params=1.5, method="wanda", data=[torch.randn(2, 784)]), "params is the share kept"),
    (dict(params=0.5, method="wanda", data=[]), "[data] data has no batch"),
    (dict(params=0.5, method="wanda", data=iter([torch.randn(2, 784)])),
     "a target with method wanda reads data twice (the calibration, then the sweep): give a list "
     "or a DataLoader, not an iterator"),
    (dict(params=0.5, exclude="("), "not a valid regex"),
    (dict(params=0.5, device="tpu"), "[device] bad device 'tpu'"),
    (dict(params=0.5, round_to=0), "round_to must be >= 1"),
    (dict(params=0.5, structured=True, method="nope"), "unknown structured method 'nope'"),
    (dict(params=0.5, data=[torch.randn(2, 784)], eval_batches=0), "eval_batches must be >= 1"),
]


@pytest.mark.parametrize("kwargs,message", BAD_TARGETS)
def test_bad_target_arguments_are_value_errors(kwargs, message):
    m, x = mlp()
    snap = snapshot(m)
    with pytest.raises(ValueError) as e:
        lopper.prune_to_target(m, x, progress=False, **kwargs)
    one_line(e, message if message.startswith("[") else "[prune] ", message)
    assert_same(m, snap)


BAD_SWEEPS = [
    (dict(data=None), "data is needed"),
    (dict(structured=True, allow_tied=True), "allow_tied is for single weights, not structured"),
    (dict(amounts=[0.5, 1.0]), "every amount must be in [0, 1), got 1"),
    (dict(method="taylor"), "method must be"),
    (dict(method="nope"), "unknown method 'nope'"),
    (dict(eval_batches=0), "eval_batches must be > 0"),
    (dict(exclude="[a-"), "not a valid regex"),
    (dict(device="cuda:x"), "bad device"),
    (dict(loss="hinge"), "hinge"),
    (dict(data=[]), "no batch"),
    (dict(method="wanda", data=[]), "no batch"),
    (dict(calib_batches=2), "calib_batches is for method wanda and sparsegpt"),
    (dict(method="wanda", block_size=16), "block_size is for method sparsegpt, not wanda"),
    (dict(method="wanda", dampening=0.1), "dampening is for method sparsegpt"),
    (dict(structured=True, block_size=16), "block_size is for method sparsegpt"),
    (dict(method="wanda", calib_batches=0), "calib_batches must be >= 1"),
    (dict(method="sparsegpt", block_size=0), "[sensitivity] block_size must be in 1.."),
    (dict(method="sparsegpt", dampening=-1.0), "[sensitivity] dampening must be > 0"),
]


@pytest.mark.parametrize("kwargs,message", BAD_SWEEPS)
def test_bad_sensitivity_arguments_are_value_errors(kwargs, message):
    m, x = mlp()
    snap = snapshot(m)
    kwargs = {"data": batches(n=1, size=2), **kwargs}
    data = kwargs.pop("data")
    with pytest.raises(ValueError) as e:
        lopper.sensitivity(m, x, data, progress=False, **kwargs)
    one_line(e, message)
    assert_same(m, snap)


def test_bad_types_are_type_errors(sweep):
    m, x = mlp()
    with pytest.raises(TypeError) as e:
        lopper.prune_to_target(m, x, params="half")
    one_line(e, "[prune] params must be a float")
    with pytest.raises(TypeError) as e:
        lopper.prune_to_target(m, x, params=0.5, sensitivity={"format": "lopper.sensitivity/1"})
    one_line(e, "SensitivityReport")
    with pytest.raises(TypeError) as e:
        lopper.sensitivity(m, x, batches(n=1), amounts=0.5)
    one_line(e, "[sensitivity] amounts")
    with pytest.raises(TypeError) as e:
        lopper.sensitivity(m, x, batches(n=1), method="wanda", calib_batches=True)
    one_line(e, "[sensitivity] calib_batches must be an int, got bool")
    with pytest.raises(TypeError) as e:
        lopper.prune_to_target(m, x, params=0.5, method="sparsegpt", data=batches(n=1),
                               dampening="0.01")
    one_line(e, "[prune] dampening must be a float")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        lopper.sensitivity(lambda t: t, x, batches(n=1))


def test_data_with_a_sensitivity_measures_the_module_before_and_after(sweep):
    # As `lopper prune --target-params 0.5 --sensitivity FILE --data SPEC`: the amounts come from
    # the given curves, the loss and top-1 before and after from the data.
    m, x = copy.deepcopy(sweep[0]), sweep[1]
    data = batches(n=2, seed=7)  # not the sweep's batches
    loss_before, top1_before = own_loss_and_top1(copy.deepcopy(m), data)
    report = lopper.prune_to_target(m, x, params=0.5, sensitivity=sweep[4], data=data,
                                    progress=False)
    loss = report.to_dict()["target"]["loss"]
    assert loss["top1_base"] == pytest.approx(top1_before)
    loss_after, top1_after = own_loss_and_top1(m, data)
    assert report.measured_top1 == pytest.approx(top1_after)
    assert report.measured_loss == pytest.approx(loss_after, rel=1e-4)


def test_sensitivity_of_another_module_is_a_value_error(sweep):
    other = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    snap = snapshot(other)
    with pytest.raises(ValueError) as e:
        lopper.prune_to_target(other, torch.randn(2, 1, 28, 28), params=0.5, sensitivity=sweep[4],
                               progress=False)
    one_line(e, "[prune] the sensitivity is of another module")
    assert_same(other, snap)


def test_model_problems_are_runtime_errors():
    m, x = mlp()
    snap = snapshot(m)
    # Batches the module cannot take: lopper's executor says so while evaluating.
    with pytest.raises(RuntimeError) as e:
        lopper.sensitivity(m, x, [torch.randn(2, 3, 5, 5)], amounts=[0.5], progress=False)
    one_line(e)
    # A target no amount reaches: the one layer left cannot lose enough.
    with pytest.raises(RuntimeError) as e:
        lopper.prune_to_target(m, x, params=0.01, exclude=r"^(1|3)\.", progress=False)
    one_line(e, "[prune] cannot reach params 0.01")
    assert_same(m, snap)

    u = DataDependent()
    snap = snapshot(u)
    with pytest.raises(RuntimeError, match=r"^\[sensitivity\] the module does not export"):
        lopper.sensitivity(u, torch.randn(2, 4), [(torch.randn(2, 4), torch.tensor([0, 1]))],
                           progress=False)
    assert_same(u, snap)


# --- the GIL, progress ----------------------------------------------------------------------------


def test_sweep_releases_the_gil(monkeypatch):
    """Between two steps of the sweep (lopper working), another Python thread keeps counting.

    NOTE: with a switch interval of minutes, Python never takes the GIL from a thread that holds
    it: the counter runs only while the GIL is released (it hands the GIL back itself with
    time.sleep(0), so the sweep's progress calls get it at once). A sweep that held the GIL would
    leave every gap at 0."""
    seen = []
    ticks = [0]
    running = [True]

    def count():
        while running[0]:
            ticks[0] += 1
            if ticks[0] % 500 == 0:
                time.sleep(0)

    class Recorder:
        def __init__(self, label):
            pass

        def __call__(self, done, total, what):
            seen.append(ticks[0])

        def close(self):
            pass

    monkeypatch.setattr(lopper_prune_module, "_Progress", Recorder)
    m, x = mlp()
    counter = threading.Thread(target=count)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(300)
    counter.start()
    try:
        lopper.sensitivity(m, x, batches(n=4, size=512), amounts=[0.2, 0.4, 0.6, 0.8],
                           eval_batches=4)
    finally:
        running[0] = False
        counter.join()
        sys.setswitchinterval(interval)
    gaps = [b - a for a, b in zip(seen, seen[1:])]
    assert len(gaps) == 52  # the plan, then 4 batches for the unpruned module and each point
    assert sum(g > 0 for g in gaps) >= 6 and sum(gaps) > 1000, gaps


def test_ctrl_c_stops_the_sweep(monkeypatch):
    """Ctrl-C (a KeyboardInterrupt where the progress runs) stops the work between two steps, and
    a target leaves the module untouched."""
    calls = []

    class Interrupt:
        def __init__(self, label):
            pass

        def __call__(self, done, total, what):
            calls.append(done)
            if done == 2:
                raise KeyboardInterrupt

        def close(self):
            pass

    monkeypatch.setattr(lopper_prune_module, "_Progress", Interrupt)
    m, x = mlp()
    snap = snapshot(m)
    with pytest.raises(KeyboardInterrupt):
        lopper.sensitivity(m, x, batches(n=1, size=4), amounts=[0.3, 0.6])
    assert calls == [0, 1, 2]
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        lopper.prune_to_target(m, x, params=0.5, data=batches(n=1, size=4))
    assert calls == [0, 1, 2]
    assert_same(m, snap)


def test_progress_lines_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    m, x = mlp()
    lopper.sensitivity(m, x, batches(n=1, size=4), amounts=[0.3, 0.6])
    err = capsys.readouterr().err
    # The plan first, then about four lines over the sweep (a batch for the unpruned module, one
    # per point).
    assert "sensitivity: 3 layers x 2 amounts = 6 points, 1 batch each: 7 batch runs" in err, err
    assert "sensitivity 7/7  " in err and "@ 0.6" in err, err
    assert len(err.strip().splitlines()) <= 5


def test_progress_with_tqdm(capsys):
    pytest.importorskip("tqdm")
    m, x = mlp()
    lopper.sensitivity(m, x, batches(n=1, size=4), amounts=[0.5])
    err = capsys.readouterr().err
    assert "sensitivity: 3 layers x 1 amount = 3 points" in err and "4/4" in err, err


def test_public_names():
    for name in ("sensitivity", "prune_to_target", "SensitivityReport", "SensitivityLayer",
                 "SensitivityPoint", "TargetReport", "TargetLayer"):
        assert name in lopper.__all__ and getattr(lopper, name).__doc__


def test_block_sensitivity_removes_each_residual_block_alone():
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
            with torch.no_grad():
                self.fc2.weight.mul_(scale)
                self.fc2.bias.mul_(scale)

        def forward(self, x):
            return x + self.fc2(torch.relu(self.fc1(x)))

    m = torch.nn.Sequential(Block(1.0), Block(1e-3), Block(1.0), torch.nn.Linear(8, 4)).eval()
    snap = snapshot(m)
    data = [(torch.randn(8, 8), torch.randint(0, 4, (8,))) for _ in range(2)]
    report = lopper.sensitivity(m, torch.randn(2, 8), data, structured="channel,block",
                                amounts=[0.5], eval_batches=2, progress=False)
    assert report.unit == "channel+block"
    blocks = [l for l in report.layers if l.block >= 0]
    assert [l.block for l in blocks] == [0, 1, 2]
    assert all(len(l.points) == 1 and l.points[0].amount == 1.0 for l in blocks)
    rise = [abs(l.points[0].loss - report.loss) for l in blocks]
    assert rise[1] < rise[0] and rise[1] < rise[2]  # the quiet block
    assert "removed" in str(report)
    assert_same(m, snap)
    with pytest.raises(ValueError, match="channel, block or channel,block"):
        lopper.sensitivity(m, torch.randn(2, 8), data, structured="rows", progress=False)
