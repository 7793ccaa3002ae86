"""transformers models passed as they come (their default config: a key/value cache, return_dict
outputs): structured pruning in place whose config follows, so that save_pretrained +
from_pretrained gives back the pruned model; one-shot pruning with calibration batches of another
size than the example. Random init from configs, no downloads."""

import warnings

import pytest
import torch

import lopper

transformers = pytest.importorskip("transformers")
V = 96


_SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4)
# name -> (model class, config class, config): 2 layers, 4 heads, hidden 64, MLP 128.
MODELS = {
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config",
              dict(_SMALL, num_key_value_heads=2, tie_word_embeddings=True)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(_SMALL, num_key_value_heads=2)),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(vocab_size=V, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)),
    "bert": ("BertForSequenceClassification", "BertConfig", dict(_SMALL, num_labels=3)),
    "distilbert": ("DistilBertForSequenceClassification", "DistilBertConfig",
                   dict(vocab_size=V, dim=64, n_layers=2, n_heads=4, hidden_dim=128, num_labels=3)),
}
CAUSAL = ("qwen2", "llama", "gpt2")


def _model(name):
    model, config, kwargs = MODELS[name]
    torch.manual_seed(0)
    return getattr(transformers, model)(getattr(transformers, config)(**kwargs)).eval()


def _inputs(batch=2, length=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _reloaded(m, tmp_path):
    m.save_pretrained(tmp_path)
    causal = any(type(m).__name__ == MODELS[n][0] for n in CAUSAL)
    auto = (transformers.AutoModelForCausalLM if causal
            else transformers.AutoModelForSequenceClassification)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return auto.from_pretrained(tmp_path).eval()


def _params(m):
    return sum(p.numel() for p in m.parameters())


# The config key each model's pruned widths land under (the MLP's: the architecture's own name).
FOLLOWS = {"qwen2": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16},
           "llama": {"intermediate_size": 64}, "gpt2": {"n_inner": 128},
           "distilbert": {"hidden_dim": 64}}


@pytest.mark.parametrize("unit,name", [("head", "qwen2"), ("channel", "llama"),
                                       ("channel", "gpt2"), ("channel", "distilbert")])
def test_pruned_model_saves_and_reloads_to_the_same_logits(unit, name, tmp_path):
    m = _model(name)
    ex = _inputs()
    use_cache = getattr(m.config, "use_cache", None)
    before = _params(m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lopper.prune_structured(m, ex, unit=unit, amount=0.5, progress=False)
    assert _params(m) < before
    assert getattr(m.config, "use_cache", None) == use_cache  # the model's settings as they were
    assert {k: getattr(m.config, k) for k in FOLLOWS[name]} == FOLLOWS[name]
    with torch.no_grad():
        out = m(**ex).logits
        assert out.shape == ((2, 12, V) if name in CAUSAL else (2, 3))
        back = _reloaded(m, tmp_path)(**ex).logits
    torch.testing.assert_close(back, out, rtol=0, atol=1e-5)


def test_heads_of_grouped_query_attention_and_generate_keeps_its_cache():
    m = _model("llama")
    lopper.prune_structured(m, _inputs(), unit="head", amount=0.5, progress=False)
    assert (m.config.num_attention_heads, m.config.num_key_value_heads, m.config.head_dim) == \
        (2, 1, 16)
    prompt = _inputs(batch=1, length=4)["input_ids"]
    with torch.no_grad():
        cached = m.generate(prompt, max_new_tokens=6, do_sample=False)
        plain = m.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)


@pytest.mark.parametrize("layers", [2, 4])
def test_what_the_config_cannot_describe_is_kept_and_said(layers, tmp_path):
    torch.manual_seed(0)
    m = transformers.BertForSequenceClassification(
        transformers.BertConfig(**dict(MODELS["bert"][2], num_hidden_layers=layers))).eval()
    ex = _inputs()
    with pytest.warns(UserWarning, match="config cannot describe its size"):
        report = lopper.prune_structured(m, ex, unit="channel", amount=0.5, progress=False)
    kept = [g for g in report.groups if "config cannot describe" in g.blocked]
    assert kept and any("pooler" in p for g in kept for p in g.layer_params)
    assert m.bert.pooler.dense.weight.shape == (64, 64)
    assert m.config.intermediate_size == 64  # every MLP at half its width
    assert all(layer.intermediate.dense.out_features == 64 for layer in m.bert.encoder.layer)
    with torch.no_grad():
        torch.testing.assert_close(_reloaded(m, tmp_path)(**ex).logits, m(**ex).logits, rtol=0,
                                   atol=1e-5)


def test_heads_a_config_cannot_describe_are_refused_unless_reloadable_is_false():
    m = _model("gpt2")  # its head size follows n_embd
    ex = _inputs()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(RuntimeError, match="reloadable=False"):
        lopper.prune_structured(m, ex, unit="head", amount=0.5, progress=False)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())  # as it was
    assert m.config.num_attention_heads == 4
    n = _params(m)
    lopper.prune_structured(m, ex, unit="head", amount=0.5, progress=False, reloadable=False)
    assert _params(m) < n


def test_global_scope_is_refused_before_the_export():
    m = _model("llama")
    with pytest.raises(ValueError, match="scope='local'"):
        lopper.prune_structured(m, _inputs(), unit="channel", amount=0.3, scope="global",
                                progress=False)
    with pytest.raises(TypeError, match="reloadable must be a bool"):
        lopper.prune_structured(m, _inputs(), amount=0.3, reloadable=1)


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_gradient_criteria_take_batches_of_another_size(name):
    """taylor and grad score on the module's export: the example (batch 1, length 12) and the
    batches (batch 3, length 10) differ in both dims."""
    example = _inputs(batch=1)
    data = [_inputs(batch=3, length=10, seed=s) for s in range(2)]
    if name == "bert":
        for i, d in enumerate(data):
            d["labels"] = torch.tensor([0, 1, 2]).roll(i)
    for method in ("taylor", "grad"):
        m = _model(name)
        report = lopper.prune(m, example, method=method, amount=0.5, data=data, masks=False,
                              progress=False)
        assert 0.3 < report.sparsity < 0.6, (method, report.sparsity)
    m = _model(name)
    before = _params(m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lopper.prune_structured(m, example, method="taylor", amount=0.3, data=data,
                                progress=False)
    assert _params(m) < before


def test_one_shot_calibrates_on_batches_of_another_size():
    m = _model("llama")
    data = [_inputs(batch=3, length=8, seed=s) for s in range(2)]
    report = lopper.prune(m, _inputs(batch=2), method="wanda", amount=0.5, data=data,
                          progress=False)
    assert 0.45 < report.sparsity < 0.55
    assert m.config.use_cache  # left as it was


def test_a_target_says_when_the_config_cannot_follow():
    m = _model("llama")
    with pytest.warns(UserWarning, match="would not give the pruned model back"):
        lopper.prune_to_target(m, _inputs(), params=0.8, structured=True, progress=False)


def test_masks_made_permanent_save_and_reload_with_their_zeros(tmp_path):
    m = _model("llama")
    data = [_inputs(batch=2, length=8, seed=s) for s in range(2)]
    with pytest.warns(UserWarning, match="lopper.make_permanent"):
        report = lopper.prune(m, _inputs(), method="wanda", amount=0.5, data=data,
                              progress=False, exclude="lm_head")
    # The report says it too (its JSON and HTML page carry its warnings).
    assert any("from_pretrained starts every such weight anew" in w
               for w in report.to_dict()["warnings"])
    with torch.no_grad():
        out = m(**_inputs()).logits
    made = lopper.make_permanent(m)
    assert "model.layers.0.self_attn.q_proj.weight" in made and "lm_head.weight" not in made
    assert lopper.make_permanent(m) == []  # nothing masked any more
    assert not any(k.endswith(("_orig", "_mask")) for k in m.state_dict())
    back = _reloaded(m, tmp_path)
    w = back.model.layers[0].mlp.up_proj.weight
    assert 0.45 < float((w == 0).float().mean()) < 0.55
    with torch.no_grad():
        torch.testing.assert_close(back(**_inputs()).logits, out, rtol=0, atol=1e-5)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        lopper.make_permanent("model")


def _export_path(monkeypatch, module):
    """lopper.prune through the module's ONNX export (what `lopper prune` computes on it), as for
    any other module; returns the exclude that leaves its output head alone."""
    from lopper import _hf
    exclude = _hf.head_excluded(module, None)
    monkeypatch.setattr("lopper._prune._hf.is_transformers_model", lambda m: False)
    return exclude


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("method,pattern", [("wanda", None), ("sparsegpt", None),
                                            ("sparsegpt", "2:4")])
def test_one_shot_in_place_equals_the_export(name, method, pattern, monkeypatch):
    """A transformers model is pruned through its own blocks, never exported: the masks equal the
    export's (lopper prune's on the same weights and batches), SparseGPT's weights to float
    rounding, the output head left alone."""
    data = [_inputs(batch=4, length=16, seed=s) for s in range(3)]
    amount = None if pattern else 0.5
    ex = data[0]
    here = _model(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = lopper.prune(here, _inputs(batch=1), method=method, amount=amount,
                              pattern=pattern, data=data, masks=False, progress=False)
        there = _model(name)
        exclude = _export_path(monkeypatch, there)
        lopper.prune(there, ex, method=method, amount=amount, pattern=pattern, data=data,
                     masks=False, progress=False, exclude=exclude)
    assert report.macs_before is None  # no export was made
    assert 0.4 < report.sparsity < 0.55
    a, b = here.state_dict(), there.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k] != 0, b[k] != 0), k
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)
    head = here.get_output_embeddings()
    if head is not None:
        assert bool((head.weight != 0).all())  # left alone


def test_one_shot_in_place_saves_and_reloads_with_its_zeros(tmp_path):
    m = _model("qwen2")
    data = [_inputs(batch=2, length=8, seed=s) for s in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # masks=False: nothing to warn of
        report = lopper.prune(m, _inputs(), method="sparsegpt", amount=0.5, data=data,
                              masks=False, progress=False)
    assert not any(k.endswith(("_orig", "_mask")) for k in m.state_dict())
    assert [l.skipped for l in report.layers if l.name == "lm_head"] != [""]
    with torch.no_grad():
        out = m(**_inputs()).logits
        back = _reloaded(m, tmp_path)
        torch.testing.assert_close(back(**_inputs()).logits, out, rtol=0, atol=1e-5)
    w = back.model.layers[1].mlp.down_proj.weight
    assert 0.45 < float((w == 0).float().mean()) < 0.55
    with pytest.raises(RuntimeError, match="without an export"):
        report.save_html(tmp_path / "page.html")


def test_one_shot_in_place_options():
    data = [_inputs(batch=2, length=8, seed=s) for s in range(2)]
    m = _model("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lopper.prune(m, _inputs(), method="wanda", amount=0.5, data=data, prune_head=True,
                     progress=False)
    assert 0.45 < float((m.lm_head.weight == 0).float().mean()) < 0.55  # a mask, as asked
    assert hasattr(m.lm_head, "weight_mask")
    m = _model("llama")
    with pytest.raises(ValueError, match="device cuda"):
        lopper.prune(m, _inputs(), method="wanda", amount=0.5, data=data, device="cuda")
    with pytest.raises(TypeError, match="masks must be a bool"):
        lopper.prune(m, _inputs(), method="wanda", amount=0.5, data=data, masks=1)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(RuntimeError, match="failed on calibration batch 0: ValueError"):
        lopper.prune(m, _inputs(), method="wanda", amount=0.5, data=[{"bogus": torch.ones(2)}],
                     progress=False)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())  # as it was
    # Gradient criteria need the whole graph: the export path, as before.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = lopper.prune(m, data[0], method="taylor", amount=0.3, data=data,
                              progress=False)
    assert report.macs_before is not None
