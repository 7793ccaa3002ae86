"""Depth and width of transformers language models in place: whole decoder layers go
(prune_structured(unit="layer")), their bookkeeping follows (layer_idx, num_hidden_layers,
layer_types), generate() and save_pretrained + from_pretrained work, and the block influence is the
definition's; the hidden size shrinks through RMSNorm with the config's hidden_size. Random init
from configs, no downloads."""

import warnings

import numpy as np
import pytest
import torch

import lopper
from lopper import _lopper

transformers = pytest.importorskip("transformers")
V = 96
_SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2)
MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(_SMALL)),
    # Sliding-window layers from layer 3 on: layer_types differ per layer.
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config",
              dict(_SMALL, tie_word_embeddings=True, use_sliding_window=True, sliding_window=4,
                   max_window_layers=3)),
}


def _model(name):
    model, config, kwargs = MODELS[name]
    torch.manual_seed(0)
    return getattr(transformers, model)(getattr(transformers, config)(**kwargs)).eval()


def _batches(n=3, batch=2, length=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1, V, (batch, length), generator=g)} for _ in range(n)]


def _example():
    return _batches(1, 1, 8, seed=5)[0]


def _reloads_and_generates(m, ids, tmp_path):
    """save_pretrained + from_pretrained gives the same logits, and generate() with its key/value
    cache gives what generate() without it gives."""
    m.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.allclose(back(ids).logits, m(ids).logits, atol=1e-5)
        a = m.generate(ids, max_new_tokens=4, do_sample=False, use_cache=True)
        b = m.generate(ids, max_new_tokens=4, do_sample=False, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("method", ["influence", "loss", "random"])
def test_layers_go_and_the_model_reloads_and_generates(name, method, tmp_path):
    m = _model(name)
    before_types = list(getattr(m.config, "layer_types", None) or [])
    n_params = sum(p.numel() for p in m.parameters())
    data = None if method == "random" else _batches()
    r = lopper.prune_structured(m, _example(), unit="layer", method=method, amount=2,
                                data=data, seed=None if data else 1, progress=False)
    gone = [g.id for g in r.groups if g.size_after == 0]
    assert len(gone) == 2 and len(r.groups) == 6
    assert m.config.num_hidden_layers == 4 and len(m.model.layers) == 4
    assert [layer.self_attn.layer_idx for layer in m.model.layers] == [0, 1, 2, 3]
    kept = [i for i in range(6) if i not in gone]
    if before_types:
        assert m.config.layer_types == [before_types[i] for i in kept]
    assert r.params < r.params_before == n_params
    assert r.params == sum(p.numel() for p in m.parameters())
    assert r.params_before - r.params == sum(r.groups[i].params for i in gone)
    assert "layers" in str(r) and r.to_dict()["layers"] == 4
    _reloads_and_generates(m, _example()["input_ids"], tmp_path)


def test_influence_is_one_minus_the_mean_cosine_and_ranks():
    m = _model("llama")
    layers = m.model.layers
    seen = {i: [] for i in range(6)}
    hooks = [layer.register_forward_hook(
        lambda _, a, k, out, i=i: seen[i].append((k.get("hidden_states", a[0] if a else None),
                                                  out[0] if isinstance(out, tuple) else out)),
        with_kwargs=True) for i, layer in enumerate(layers)]
    data = _batches()
    with torch.no_grad():
        for b in data:
            m(**b)
    for h in hooks:
        h.remove()
    want = []
    for i in range(6):
        cos = []
        for x, y in seen[i]:
            x, y = x.double().numpy().reshape(-1, 64), y.double().numpy().reshape(-1, 64)
            cos.extend((x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1))
        want.append(1 - float(np.mean(cos)))
    r = lopper.prune_structured(m, _example(), unit="layer", amount=0.5, data=data,
                                progress=False)
    got = [g.score for g in r.groups]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert sorted(g.id for g in r.groups if g.size_after == 0) == sorted(np.argsort(want)[:3])


def test_block_influence_binding():
    b = _lopper._BlockInfluence()
    b.add(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[0.0, 1.0], [2.0, 2.0]]), -1)
    assert b.vectors == 2 and abs(b.value - 0.5) < 1e-12


def test_exclude_keeps_layers():
    m = _model("llama")
    r = lopper.prune_structured(m, _example(), unit="layer", method="random", amount=3,
                                exclude=r"layers\.[0-2]$", seed=0, progress=False)
    assert [g.blocked for g in r.groups[:3]] == ["excluded"] * 3
    assert all(g.size_after == 0 for g in r.groups[3:])


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(amount=7, method="random"), ValueError, "layers"),
    (dict(amount=1.5, method="random"), ValueError, "amount"),
    (dict(amount=1), ValueError, "data"),  # influence needs data
    (dict(amount=1, method="l1", data=[{}]), ValueError, "unknown method 'l1'"),
    (dict(amount=1, method="random", scope="global"), ValueError, "scope"),
    (dict(amount=1, method="random", exclude="("), ValueError, "exclude"),
    (dict(amount=1, method="random", exclude="layers"), ValueError, "exclude leaves none"),
])
def test_bad_arguments_leave_the_model_alone(kwargs, error, text):
    m = _model("llama")
    state = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(error, match=text):
        lopper.prune_structured(m, _example(), unit="layer", progress=False, **kwargs)
    assert m.config.num_hidden_layers == 6 and len(m.model.layers) == 6
    assert all(torch.equal(state[k], v) for k, v in m.state_dict().items())


def test_a_module_that_is_not_transformers_is_refused():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="lopper prune --structured block"):
        lopper.prune_structured(m, torch.randn(1, 4), unit="layer", method="random", amount=1)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hidden_size_shrinks_with_the_config(name, tmp_path):
    """unit="channel" shrinks the residual stream through RMSNorm (a ReduceMean over the channels
    in the export): the embedding, every norm, every projection in and out (and Qwen2's tied
    lm_head) go with it, and the config's hidden_size (with head_dim, which Qwen2 derives from
    it) follows."""
    m = _model(name)
    ids = _example()["input_ids"]
    r = lopper.prune_structured(m, _example(), amount=0.5, progress=False)
    hidden = r.groups[0]
    assert (hidden.size_before, hidden.size_after, hidden.blocked) == (64, 32, "")
    assert m.config.hidden_size == 32 and m.config.head_dim == 16
    assert m.model.embed_tokens.weight.shape == (V, 32)
    assert m.model.norm.weight.shape == (32,)
    assert m.model.layers[0].self_attn.q_proj.weight.shape[1] == 32
    _reloads_and_generates(m, ids, tmp_path)
