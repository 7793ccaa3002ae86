"""lopper.prune_structured(model, ..., unit="expert"): whole experts of transformers MoE models
(Mixtral, Qwen2-MoE, Qwen3-MoE: fused experts) removed in place, by REAP, frequency, activation
or at random; the scores against the definitions computed here in float64; generate() and
save_pretrained + from_pretrained after; every refusal leaves the model as it was."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import lopper

transformers = pytest.importorskip("transformers")

VOCAB = 96
METHODS = ("reap", "frequency", "activation", "random")


def _routers_apart(model):
    """transformers draws routers from N(0, 0.02): every expert then scores nearly alike. Wider
    rows give the experts distinct shares, as a trained router does."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
    return model


def mixtral(layers=2):
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=64, tie_word_embeddings=False)
    return _routers_apart(transformers.MixtralForCausalLM(cfg).eval())


def qwen2_moe():
    """Three layers, the middle one a dense MLP (mlp_only_layers); a shared expert beside the
    routed ones; top-k weights not renormalised."""
    torch.manual_seed(0)
    cfg = transformers.Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
        mlp_only_layers=[1], norm_topk_prob=False, max_position_embeddings=64,
        tie_word_embeddings=False)
    return _routers_apart(transformers.Qwen2MoeForCausalLM(cfg).eval())


def qwen3_moe():
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64,
        tie_word_embeddings=False)
    return _routers_apart(transformers.Qwen3MoeForCausalLM(cfg).eval())


MODELS = {"mixtral": mixtral, "qwen2_moe": qwen2_moe, "qwen3_moe": qwen3_moe}
COUNT_KEY = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_experts"}


def batches(n=3, size=2, length=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1, VOCAB, (size, length), generator=g)}
            for _ in range(n)]


EXAMPLE = {"input_ids": torch.arange(1, 9).view(1, 8)}


def moe_blocks(model):
    return {n: m for n, m in model.named_modules()
            if hasattr(m, "experts") and hasattr(m, "gate") and hasattr(m.experts, "down_proj")}


def snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()}, model.config.to_dict(),
            {n: (m.gate.num_experts, m.experts.num_experts) for n, m in moe_blocks(model).items()})


def assert_untouched(model, snap):
    state, config, counts = snap
    now = model.state_dict()
    assert set(now) == set(state)
    for k, v in state.items():
        assert now[k].shape == v.shape and torch.equal(now[k], v), k
    assert model.config.to_dict() == config
    assert {n: (m.gate.num_experts, m.experts.num_experts)
            for n, m in moe_blocks(model).items()} == counts


def prune(model, **kw):
    kw.setdefault("unit", "expert")
    kw.setdefault("progress", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lopper.prune_structured(model, EXAMPLE, **kw)


# ------------------------------------------------------------------------------------------------
# What it removes, and the model after.

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(MODELS))
def test_each_method_removes_whole_experts_in_place(name, method):
    model = MODELS[name]()
    before = {n: (m.experts.gate_up_proj.detach().clone(), m.experts.down_proj.detach().clone(),
                  m.gate.weight.detach().clone(), m.experts.gate_up_proj)
              for n, m in moe_blocks(model).items()}
    data = None if method == "random" else batches()
    report = prune(model, method=method, amount=0.25, data=data, seed=3 if method == "random"
                   else None)
    assert isinstance(report, lopper.ExpertReport)
    assert [g.layers[0] for g in report.groups] == list(before)
    assert getattr(model.config, COUNT_KEY[name]) == 6
    for g in report.groups:
        assert (g.kind, g.size_before, g.size_after, len(g.removed)) == ("expert", 8, 6, 2)
        block = model.get_submodule(g.layers[0])
        gate_up, down, router, param = before[g.layers[0]]
        kept = [e for e in range(8) if e not in g.removed]
        # The same Parameter objects, holding the kept experts' slices and router rows.
        assert block.experts.gate_up_proj is param
        assert torch.equal(block.experts.gate_up_proj, gate_up[kept])
        assert torch.equal(block.experts.down_proj, down[kept])
        assert torch.equal(block.gate.weight, router[kept])
        assert block.experts.num_experts == block.gate.num_experts == 6
        if method != "random":
            # The experts removed are those of lowest score.
            scores = report.scores[g.layers[0]]
            assert len(scores) == 8
            assert max(scores[e] for e in g.removed) <= min(scores[e] for e in kept)
    if name == "qwen2_moe":
        assert type(model.model.layers[1].mlp).__name__ == "Qwen2MoeMLP"  # the dense layer
        assert model.model.layers[0].mlp.shared_expert.gate_proj.weight.shape == (24, 32)
    assert report.params < report.params_before == report.params + sum(
        2 * (m.experts.gate_up_proj[0].numel() + m.experts.down_proj[0].numel() +
             m.gate.weight[0].numel()) for m in moe_blocks(model).values())
    out = model.generate(EXAMPLE["input_ids"], max_new_tokens=4, do_sample=False,
                         pad_token_id=0)
    assert out.shape == (1, 12)


@pytest.mark.parametrize("name", list(MODELS))
def test_pruned_model_saves_and_reloads_to_the_same_logits(name, tmp_path):
    model = MODELS[name]()
    prune(model, method="reap", amount=0.5, data=batches())
    model.save_pretrained(tmp_path)
    again = type(model).from_pretrained(tmp_path).eval()
    assert getattr(again.config, COUNT_KEY[name]) == 4
    if name == "qwen2_moe":
        assert again.config.mlp_only_layers == [1] and again.config.decoder_sparse_step == 1
    ids = batches(1, 2, 10, seed=7)[0]["input_ids"]
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, again(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_an_int_amount_is_a_count_and_a_fraction_drops_as_llm_compressor():
    model = mixtral()
    report = prune(model, method="frequency", amount=3, data=batches())
    assert [g.size_after for g in report.groups] == [5, 5]
    # int(8 * 0.3) = 2, as llm-compressor's REAP drops (not round's 2.4 -> 2 by chance: 0.37 too)
    for amount, left in ((0.3, 6), (0.37, 6), (0.5, 4), (0.0, 8)):
        model = mixtral()
        report = prune(model, method="random", amount=amount)
        assert [g.size_after for g in report.groups] == [left, left], amount


def test_random_is_seeded_and_reads_no_data():
    picks = []
    for seed in (0, 0, 1):
        model = mixtral()
        report = prune(model, method="random", amount=0.5, seed=seed)
        picks.append([g.removed for g in report.groups])
    assert picks[0] == picks[1]
    assert picks[0] != picks[2]


def test_data_as_tensors_dicts_or_pairs_and_at_most_calib_batches():
    data = batches(4)
    forms = {
        "dicts": data,
        "tensors": [b["input_ids"] for b in data],
        "pairs": [(b["input_ids"], b["input_ids"]) for b in data],
        "dict pairs": [(b, b["input_ids"]) for b in data],
        "dicts with labels": [dict(b, labels=b["input_ids"]) for b in data],
    }
    scores = {}
    for name, items in forms.items():
        model = mixtral()
        scores[name] = prune(model, method="frequency", amount=0.25, data=iter(items),
                             calib_batches=3).scores
    first = scores["dicts"]
    assert all(s == first for s in scores.values())
    assert sum(first["model.layers.0.mlp"]) == 2 * 3 * 24  # 3 batches of 2 x 12 tokens, top-2


# ------------------------------------------------------------------------------------------------
# The scores against their definitions, in float64.

def _routing(model, data, index):
    """Per batch, layer `index`'s MoE input [T, H], top-k indices and weights, as its experts
    module receives them."""
    seen = []
    block = model.model.layers[index].mlp
    h = block.experts.register_forward_hook(
        lambda m, a, o: seen.append((a[0].double(), a[1].clone(), a[2].double())))
    try:
        with torch.no_grad():
            for b in data:
                model(**b)
    finally:
        h.remove()
    return block, seen


def _definition(model, data, index):
    """{criterion: per-expert scores} of layer `index` by the definitions: REAP the mean over the
    tokens routed to an expert of routing weight x ||its output||_2, activation the mean norm,
    frequency the count. Each expert's output computed here: down(silu(gate) * up)."""
    block, seen = _routing(model, data, index)
    ex = block.experts
    n = ex.num_experts
    inner = ex.gate_up_proj.shape[1] // 2
    reap = torch.zeros(n, dtype=torch.float64)
    act = torch.zeros(n, dtype=torch.float64)
    count = torch.zeros(n, dtype=torch.float64)
    for x, idx, w in seen:
        for t in range(x.shape[0]):
            for j in range(idx.shape[1]):
                e = int(idx[t, j])
                gu = ex.gate_up_proj[e].detach().double() @ x[t]
                y = ex.down_proj[e].detach().double() @ (F.silu(gu[:inner]) * gu[inner:])
                norm = float(torch.linalg.vector_norm(y))
                reap[e] += float(w[t, j]) * norm
                act[e] += norm
                count[e] += 1
    per = count.clamp(min=1)
    return {"reap": (reap / per).tolist(), "activation": (act / per).tolist(),
            "frequency": count.tolist()}


@pytest.mark.parametrize("method", ["reap", "activation", "frequency"])
def test_scores_are_the_definition(method):
    model = mixtral(layers=1)
    data = batches()
    want = _definition(model, data, 0)[method]
    report = prune(model, method=method, amount=0.25, data=data)
    got = report.scores["model.layers.0.mlp"]
    assert got == pytest.approx(want, rel=1e-5)
    order = sorted(range(8), key=lambda e: (want[e], e))
    assert report.groups[0].removed == sorted(order[:2])
    if method == "frequency":
        assert sum(got) == 2 * sum(b["input_ids"].numel() for b in data)  # top-2 of every token


def test_reap_uses_the_weights_as_the_model_gives_them_and_goes_layer_by_layer():
    """Qwen2-MoE without renormalisation: the raw softmax weights. Layer 2 is scored on the model
    with layer 0 already pruned (the dense layer 1 between), as llm-compressor's sequential
    pipeline does."""
    model = qwen2_moe()
    original = copy.deepcopy(model)
    data = batches()
    first = _definition(original, data, 0)["reap"]
    report = prune(model, method="reap", amount=0.5, data=data)
    assert report.scores["model.layers.0.mlp"] == pytest.approx(first, rel=1e-5)
    _, seen = _routing(original, data, 0)
    assert all(float(w.sum(-1).max()) < 1 for _, _, w in seen)  # not renormalised
    # Layer 0 pruned by hand as the report says, then layer 2's scores by the definition.
    removed = report.groups[0].removed
    kept = [e for e in range(8) if e not in removed]
    block = original.model.layers[0].mlp
    with torch.no_grad():
        for p in (block.experts.gate_up_proj, block.experts.down_proj, block.gate.weight):
            p.data = p.data[kept]
    block.experts.num_experts = block.gate.num_experts = len(kept)
    second = _definition(original, data, 2)["reap"]
    assert report.scores["model.layers.2.mlp"] == pytest.approx(second, rel=1e-5)
    unpruned = _definition(copy.deepcopy(model), data, 0)  # (the pruned model runs as well)
    assert len(unpruned["reap"]) == 4


# ------------------------------------------------------------------------------------------------
# The report.

def test_report_table_json_and_page(tmp_path):
    model = mixtral()
    report = prune(model, method="reap", amount=0.25, data=batches())
    text = str(report)
    assert "model.layers.0.mlp" in text and "experts" in text and "(was 16" in text
    assert "ExpertReport(method='reap', layers=2, experts=16 -> 12" in repr(report)
    d = report.to_dict()
    assert (d["structured"], d["method"], d["experts_before"], d["experts"]) == (
        "expert", "reap", 16, 12)
    assert d["params_before"] == report.params_before and d["params"] == report.params
    assert [g["removed"] for g in d["groups"]] == [g.removed for g in report.groups]
    assert len(d["groups"][0]["scores"]) == 8 and sum(d["groups"][0]["tokens"]) == 2 * 3 * 24
    assert report.barriers == [] and report.experts_before == 16 and report.experts == 12
    page = tmp_path / "r.html"
    report.save_html(page)
    html = page.read_text()
    assert "model.layers.1.mlp" in html and "lopper.report/1" in html
    with pytest.raises(OSError):
        report.save_html(tmp_path / "missing" / "r.html")


def test_experts_no_token_reached_are_said_and_go_first():
    model = mixtral(layers=1)

    def never_5_or_6(m, args, out):  # a router that never picks experts 5 and 6
        probs = torch.softmax(out[0].float(), dim=-1)
        probs[:, [e for e in (5, 6) if e < probs.shape[1]]] = 0
        top, idx = torch.topk(probs, 2, dim=-1)
        return out[0], top / top.sum(-1, keepdim=True), idx

    model.model.layers[0].mlp.gate.register_forward_hook(never_5_or_6)
    with pytest.warns(UserWarning, match="2 of its 8 experts had no calibration token"):
        report = lopper.prune_structured(model, EXAMPLE, unit="expert", method="reap",
                                         amount=2, data=batches(), progress=False)
    assert report.groups[0].removed == [5, 6]
    assert report.scores["model.layers.0.mlp"][5] == 0


# ------------------------------------------------------------------------------------------------
# Refusals: one line, the right exception, the model as it was.

def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=48, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg).eval()


class Strings:
    def __iter__(self):
        return iter(["not a batch"])


BAD = [
    # (arguments, exception, words of the one-line message)
    (dict(method="reap", amount=0.9, data=batches()), ValueError,
     "leaves MoE layer 'model.layers.0.mlp' 1 of its 8 experts, fewer than the 2"),
    (dict(method="reap", amount=7, data=batches()), ValueError, "fewer than the 2"),
    (dict(method="random", amount=9), ValueError, "is more than the 8 experts"),
    (dict(method="random", amount=1.5), ValueError, "amount must be in [0, 1], got 1.5"),
    (dict(method="random", amount=-2), ValueError, "amount must be a count >= 0"),
    (dict(method="random"), ValueError, "needs amount"),
    (dict(method="random", amount="0.5"), TypeError, "amount must be a float"),
    (dict(method="l1", amount=0.25, data=batches()), ValueError,
     "method 'l1' does not rank experts (unit 'expert' takes reap, frequency, activation, "
     "random)"),
    (dict(amount=0.25), ValueError, "method reap ranks experts"),  # reap: the default
    (dict(method="taylor", amount=0.25, data=batches()), ValueError,
     "method 'taylor' does not rank experts"),
    (dict(method="reap", amount=0.25), ValueError, "method reap ranks experts by how the model "
     "routes calibration tokens: give data"),
    (dict(method="random", amount=0.25, data=batches()), ValueError, "reads no data: drop data"),
    (dict(method="reap", amount=0.25, data=batches(), seed=1), ValueError,
     "seed is for method random"),
    (dict(method="random", amount=0.25, seed=-1), ValueError, "seed must be an int >= 0"),
    (dict(method="random", amount=0.25, seed="1"), TypeError, "seed must be an int >= 0"),
    (dict(method="random", amount=0.25, scope="global"), ValueError,
     "scope is for channels and heads, not unit 'expert'"),
    (dict(method="random", amount=0.25, round_to=8), ValueError, "round_to is for channels"),
    (dict(method="random", amount=0.25, exclude="layers.0"), ValueError, "exclude is for"),
    (dict(method="random", amount=0.25, recipe={"defaults": {"amount": 0.5}}), ValueError,
     "recipe is for"),
    (dict(method="reap", amount=0.25, data=5), TypeError, "data must be an iterable"),
    (dict(method="reap", amount=0.25, data=[]), ValueError, "data gave no calibration batch"),
    (dict(method="reap", amount=0.25, data=Strings()), TypeError, "batch 0 is a str"),
    (dict(method="reap", amount=0.25, data=batches(), calib_batches=0), ValueError,
     "calib_batches must be >= 1"),
    (dict(method="reap", amount=0.25, data=batches(), device="meta"), ValueError,
     "device meta: the model's experts are pruned where the model is (cpu)"),
]


@pytest.mark.parametrize("kw,error,words", BAD, ids=[w[:40] for _, _, w in BAD])
def test_bad_arguments_are_refused_before_any_work(kw, error, words):
    model = mixtral()
    snap = snapshot(model)
    with pytest.raises(error) as e:
        prune(model, **kw)
    message = str(e.value)
    assert words in message and "\n" not in message and message.startswith("[prune]")
    assert_untouched(model, snap)


def test_a_model_without_moe_layers_is_refused():
    model = llama()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"^\[prune\] unit='expert': the model has no "
                       r"mixture-of-experts layer"):
        prune(model, method="random", amount=0.25)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_expert_methods_are_not_channel_methods():
    model = mixtral()
    snap = snapshot(model)
    with pytest.raises(ValueError, match=r"^\[prune\] unknown .*method 'reap'"):
        lopper.prune_structured(model, EXAMPLE, unit="channel", method="reap", amount=0.25,
                                data=batches(), progress=False)
    assert_untouched(model, snap)


def test_masks_of_torch_prune_are_refused():
    model = mixtral()
    torch.nn.utils.prune.l1_unstructured(model.lm_head, "weight", amount=0.5)
    with pytest.raises(ValueError, match="torch.nn.utils.prune masks"):
        prune(model, method="random", amount=0.25)


def test_a_failure_part_way_puts_the_model_back():
    """Layer 0 is pruned when layer 1 fails on the second batch: everything is put back."""
    model = mixtral()
    snap = snapshot(model)
    calls = []

    def fail(m, args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")

    h = model.model.layers[1].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="failed on calibration batch"):
        prune(model, method="reap", amount=0.5, data=batches())
    h.remove()
    assert_untouched(model, snap)
    # And when the pruned model fails on the example inputs (the last check).
    with pytest.raises(RuntimeError, match="fails on the example inputs"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lopper.prune_structured(model, {"input_ids": torch.tensor([[VOCAB + 5]])},
                                    unit="expert", method="random", amount=0.5)
    assert_untouched(model, snap)


def test_an_interrupt_puts_the_model_back():
    model = mixtral()
    snap = snapshot(model)

    def interrupt(m, args):
        raise KeyboardInterrupt

    h = model.model.layers[1].register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        prune(model, method="activation", amount=0.5, data=batches())
    h.remove()
    assert_untouched(model, snap)



# ------------------------------------------------------------------------------------------------
# lopper.sensitivity(model, ..., structured="expert"): each MoE layer alone loses each share of its
# experts, the model's next-token loss measured, the layer put back.

def sweep(model, data, **kw):
    kw.setdefault("progress", False)
    return lopper.sensitivity(model, EXAMPLE, data, structured="expert", **kw)


def lm_measures(model, items):
    """The model's own causal-LM loss (transformers' labels= loss; labels = input_ids unless the
    batch has them), as the mean over equal-sized batches, and its next-token top-1."""
    losses, hits, count = [], 0, 0
    with torch.no_grad():
        for b in items:
            labels = b.get("labels", b["input_ids"])
            out = model(input_ids=b["input_ids"], labels=labels)
            losses.append(out.loss.item())
            target = labels[:, 1:]
            keep = target != -100
            hits += int((out.logits[:, :-1].argmax(-1) == target)[keep].sum())
            count += int(keep.sum())
    return sum(losses) / len(losses), hits / count


def loud(model):
    """Experts whose outputs weigh in the residual stream (transformers' random init keeps them
    faint): which experts go then moves the loss well beyond float32's rounding."""
    with torch.no_grad():
        for m in moe_blocks(model).values():
            m.experts.down_proj.mul_(30)
    return model


def with_layer_of(model, pruned, name):
    """A copy of `model` with MoE block `name` taken from `pruned` (the rest unpruned)."""
    out = copy.deepcopy(model)
    parent, _, attr = name.rpartition(".")
    setattr(out.get_submodule(parent), attr, copy.deepcopy(pruned.get_submodule(name)))
    return out


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_expert_sensitivity_points_are_the_model_with_that_layer_pruned(name):
    model = loud(MODELS[name]())
    data = batches(n=3)
    if name == "qwen2_moe":  # labels of their own: the loss reads them, not the input IDs
        for b in data:
            b["labels"] = b["input_ids"].clone()
            b["labels"][:, :4] = -100
    snap = snapshot(model)
    report = sweep(model, data, method="reap", amounts=[0.25, 0.5, 0.6], eval_batches=2)
    assert_untouched(model, snap)
    assert isinstance(report, lopper.SensitivityReport)
    assert report.unit == "expert" and report.method == "reap" and report.samples == 4
    blocks = list(moe_blocks(model))
    assert [l.name for l in report.layers] == [f"experts {i}: {n}" for i, n in enumerate(blocks)]
    assert [l.layers for l in report.layers] == [[n] for n in blocks]
    params = sum(p.numel() for p in model.parameters())
    assert report.params == params
    loss, top1 = lm_measures(model, data[:2])
    # NOTE: 2e-6 is float32's rounding here; another choice of experts moves the loss 1e-3 or more.
    assert report.loss == pytest.approx(loss, rel=0, abs=2e-6)
    assert report.top1 == pytest.approx(top1, abs=1e-9)
    # The first MoE layer sees the unpruned model's routing in prune_structured too: its point is
    # the model with that layer pruned by prune_structured(unit="expert") on the same data.
    first = blocks[0]
    for j, amount in enumerate((0.25, 0.5)):
        pruned = copy.deepcopy(model)
        prune(pruned, method="reap", amount=amount, data=data)
        alone = with_layer_of(model, pruned, first)
        point = report.layers[0].points[j]
        want_loss, want_top1 = lm_measures(alone, data[:2])
        assert point.amount == amount and point.removed == int(8 * amount) / 8
        assert point.loss == pytest.approx(want_loss, rel=0, abs=2e-6)
        assert point.top1 == pytest.approx(want_top1, abs=1e-9)
        assert point.params == sum(p.numel() for p in alone.parameters())
        assert abs(point.loss - report.loss) > 1e-3  # the layer did lose experts
    # 0.6 of 8 experts is int(4.8) = 4, as 0.5: the same experts, the same point.
    for l in report.layers:
        a, b = l.points[1], l.points[2]
        assert (b.removed, b.loss, b.top1, b.params) == (a.removed, a.loss, a.top1, a.params)


def test_expert_sensitivity_random_points_of_every_layer():
    """random ranks each layer from the seed and the layer's index alone: every layer's point is
    the model with that layer pruned by prune_structured(method="random") alone."""
    model = loud(mixtral())
    data = batches(n=2)
    snap = snapshot(model)
    report = sweep(model, iter(data), method="random", seed=3, amounts=[0.25], eval_batches=2)
    assert_untouched(model, snap)
    pruned = copy.deepcopy(model)
    prune(pruned, method="random", seed=3, amount=0.25)
    for l, name in zip(report.layers, moe_blocks(model)):
        want_loss, want_top1 = lm_measures(with_layer_of(model, pruned, name), data)
        assert l.points[0].loss == pytest.approx(want_loss, rel=0, abs=2e-6)
        assert l.points[0].top1 == pytest.approx(want_top1, abs=1e-9)
    assert len({l.points[0].loss for l in report.layers}) == 2


def test_expert_sensitivity_prints_and_round_trips_as_json(tmp_path):
    import json
    model = mixtral()
    report = sweep(model, batches(n=2), method="frequency", amounts=[0.25, 0.5], eval_batches=2)
    text = str(report)
    assert "experts 0: model.layers.0.mlp" in text and "0.25" in text
    d = report.to_dict()
    assert d["format"] == "lopper.sensitivity/1" and d["unit"] == "expert"
    assert d["method"] == "frequency" and len(d["layers"]) == 2
    back = lopper._lopper._parse_sensitivity(json.dumps(d), "s.json")
    assert back.to_dict() == d and str(back) == text
    # Defaults: SensitivityOptions' amounts that leave every layer its top-k experts (2 of 8).
    default = sweep(model, batches(n=2), eval_batches=1)
    assert default.method == "reap"
    assert [p.amount for p in default.layers[0].points] == pytest.approx(
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    # No page: there is no export to draw; no target reads expert curves.
    with pytest.raises(ValueError, match=r"^\[sensitivity\] a sweep over the experts"):
        report.save_html(tmp_path / "s.html")
    assert not (tmp_path / "s.html").exists()
    snap = snapshot(model)
    with pytest.raises(ValueError, match="per expert"):
        lopper.prune_to_target(model, EXAMPLE, params=0.5, sensitivity=report, progress=False)
    assert_untouched(model, snap)


SWEEP_BAD = [
    (dict(amounts=[0.9]), ValueError, "leaves MoE layer 'model.layers.0.mlp' 1 of its 8 experts"),
    (dict(data=None), ValueError, "data is needed"),
    (dict(method="l2"), ValueError, "method 'l2' does not rank experts"),
    (dict(method="random", seed=1, calib_batches=1), ValueError, "reads no calibration batches"),
    (dict(seed=1), ValueError, "seed is for method random"),
    (dict(calib_batches=0), ValueError, "calib_batches must be >= 1"),
    (dict(loss="mse"), ValueError, "next-token loss"),
    (dict(round_to=2), ValueError, "round_to is for the export's sweep"),
    (dict(amounts=[1.0]), ValueError, "every amount must be in [0, 1)"),
    (dict(amounts=[]), ValueError, "lists no amount"),
    (dict(eval_batches=0), ValueError, "eval_batches must be > 0"),
    (dict(amounts="0.5"), TypeError, "amounts must be a list"),
    (dict(device="meta"), ValueError, "move it there first"),
]


@pytest.mark.parametrize("kw,error,words", SWEEP_BAD, ids=[w[:40] for _, _, w in SWEEP_BAD])
def test_expert_sensitivity_refusals_leave_the_model_alone(kw, error, words):
    model = mixtral()
    snap = snapshot(model)
    data = kw.pop("data", batches(n=2))
    with pytest.raises(error) as e:
        sweep(model, data, **kw)
    message = str(e.value)
    assert words in message and "\n" not in message and message.startswith("[sensitivity]")
    assert_untouched(model, snap)


def test_expert_sensitivity_of_a_model_without_moe_layers_is_refused():
    model = llama()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"has no mixture-of-experts layer"):
        sweep(model, batches(n=2))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_expert_sensitivity_failure_part_way_puts_the_model_back():
    model = mixtral()
    snap = snapshot(model)
    calls = []

    def fail(m, args):
        calls.append(1)
        if len(calls) == 6:  # 2 calibration batches, 2 unpruned, then a point's second batch
            raise RuntimeError("boom")

    h = model.model.layers[1].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="failed on evaluation batch 1"):
        sweep(model, batches(n=2), amounts=[0.5], eval_batches=2)
    h.remove()
    assert_untouched(model, snap)
