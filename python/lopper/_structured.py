"""lopper.prune_structured: removes channels or attention heads from an nn.Module, in place.

The module is exported to ONNX in memory; lopper's C++ library (lopper._lopper._prune_structured_onnx)
prunes the export exactly as `lopper prune --structured` would and hands back the new value of every
parameter and buffer whose shape changed, with the pruned graph's outputs on the example inputs. This
file puts the values into the module under their names, updates the sizes the standard modules keep
as attributes, and checks the shrunk module against the pruned graph.
"""
import inspect
import math
import numbers
import warnings

import torch
from torch.nn.utils import prune as _torch_prune

from lopper import _depth, _hf, _lopper
from lopper._lopper import ChannelGroup, StructuredReport  # noqa: F401 (re-exported)
from lopper._prune import (_export, _first_line, _Progress, _pruned, _same_outputs,
                           _split_inputs)

__all__ = ["ChannelGroup", "StructuredReport", "load_pruned", "prune_structured"]

# Names transformers' attention modules keep their head counts and head size under.
_HEADS = ("num_heads", "num_attention_heads", "n_head", "n_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
_HEAD_DIM = ("head_dim", "attention_head_size", "head_size")
_QUERY = ("q_proj", "query", "q", "q_lin", "to_q", "wq")
_KEY = ("k_proj", "key", "k", "k_lin", "to_k", "wk")
_VALUE = ("v_proj", "value", "v", "v_lin", "to_v", "wv")
_FUSED_QKV = ("c_attn", "qkv", "Wqkv", "query_key_value", "in_proj")
_ATTENTION_NAMES = (_HEADS, _KV_HEADS, _HEAD_DIM, _QUERY, _KEY, _FUSED_QKV)


def prune_structured(module, example_inputs, *, unit="channel", method=None, amount=None,
                     scope="local", max_layer_amount=0.9, round_to=1, exclude=None, seed=None,
                     recipe=None, data=None, loss="auto", mask_token=None, calib_batches=32,
                     device=None, rtol=1e-4, progress=True, reloadable=True):
    """Removes whole channels (conv filters, linear neurons) or attention heads from ``module``, in
    place: the module gets smaller and faster, not just sparser.

    lopper exports the module to ONNX, finds what must shrink together through its dependency
    graph (the next layers' inputs, normalization parameters, residual branches, concatenations,
    grouped and depthwise convolutions, flattens, attention head reshapes), ranks the channels
    and prunes the export as ``lopper prune --structured`` does. Then every parameter and buffer
    of the module whose tensor shrank is replaced by its pruned value, by name (the
    ``nn.Parameter`` objects stay the same, so references to them stay valid; a parameter the
    module holds directly, such as a class token, is sliced like any other), and the sizes that
    standard modules keep as attributes follow: ``Conv*`` and ``ConvTranspose*`` (in_channels,
    out_channels, groups), ``Linear`` (in_features, out_features), ``BatchNorm*``,
    ``InstanceNorm*`` (num_features), ``GroupNorm`` (num_channels), ``LayerNorm`` and ``RMSNorm``
    (normalized_shape), ``Embedding`` (embedding_dim), ``PReLU`` (num_parameters), transformers'
    ``Conv1D`` (nf, nx) and the head counts of attention modules (``num_heads``,
    ``num_attention_heads``, ``num_key_value_heads``, ``num_key_value_groups``,
    ``all_head_size``, ``split_size``). ``nn.MultiheadAttention`` cannot hold fewer heads or a
    narrower projection than its embed_dim (its forward computes head_dim = embed_dim //
    num_heads): its projections keep their size, and the groups through them are kept whole.

    Last, the shrunk module is run on ``example_inputs`` and must give lopper's pruned graph's
    outputs within ``rtol``. If it does not (a forward() that hard-codes a width or a head count:
    ``torch.split(x, [self.c, self.c])``, ``x.view(-1, 64, 4, 4)``), the module is put back and
    lopper finds the groups in the way by pruning again with groups kept whole (a binary search,
    the groups near the failure first: a few prunes per such group), keeps those at their size,
    prunes the rest and checks again. Each group kept so says why in ``report.groups``
    (``blocked``) and in a warning. When no prune passes, the module is back exactly as it was
    and a RuntimeError names the module and attribute in the way.

    Args:
        module (torch.nn.Module): the model; it must export with ``torch.onnx.export(...,
            dynamo=True)`` on ``example_inputs``. It is exported and checked in eval mode (its
            modes are put back).
        example_inputs: what ``module`` is called with: a tensor, a tuple of positional
            arguments, or a dict of keyword arguments. They also fix the shapes MACs are counted
            at.
        unit (str): ``"channel"`` (default: every channel group), ``"head"`` (only attention
            heads; grouped-query attention loses a key/value head with its query heads) or
            ``"layer"`` (whole decoder layers of a transformers model, in place, without an
            export: each kept layer's ``layer_idx``, ``num_hidden_layers`` and the config's
            per-layer lists such as ``layer_types`` follow; methods ``"influence"`` (default:
            block influence, 1 - the mean cosine similarity of a layer's input and output hidden
            states on ``data``, ShortGPT), ``"loss"`` (the model's own loss on ``data`` with the
            layer skipped) and ``"random"``; ``amount`` is a share or a count of the layers; the
            shrunk model is checked against the model run with those layers skipped), or
            ``"expert"`` (whole experts of each mixture-of-experts layer of a model with fused
            experts, Mixtral, Qwen2-MoE, Qwen3-MoE, in place: methods ``"reap"`` (default),
            ``"frequency"``, ``"activation"``, ``"random"``; ``amount`` a share (int(E * amount)
            go, as llm-compressor's REAP) or a count per layer; returns a lopper.ExpertReport).
        method (str): what ranks the channels: ``"l1"`` (default for channels and heads) or ``"l2"`` (the norm of every
            weight slice of the group), ``"bn"`` (|gamma| of its BatchNorm), ``"fpgm"``
            (distance to the other filters), ``"random"`` (seeded), ``"taylor"`` (sum of |w *
            dL/dw|; needs ``data``) or ``"activation"`` (Minitron: a channel's mean |activation|
            where the next layers read it, a head's mean L2 norm at the output projection's
            input; needs ``data``).
        amount (float or int): a float is the share in [0, 1] of each group's channels to
            remove (``scope="local"``) or of all channels (``"global"``); an int, that many.
        scope (str): ``"local"`` or ``"global"`` (one ranking across groups, scores divided by
            their group's mean; no group loses more than ``max_layer_amount``).
        max_layer_amount (float): global: the largest share any group loses (default 0.9).
        round_to (int): keep channel counts a multiple of this (8 or 16 suits vector units).
        exclude (str): keep the groups that have a layer whose node or parameter name (e.g.
            ``"fc1.weight"``) matches this regular expression (ECMAScript, searched).
        seed (int): ``random``: the seed (default 0).
        recipe (dict or str or os.PathLike): per-group amounts instead of ``amount``: a dict or
            a YAML file as ``lopper prune --recipe`` reads (a rule matching any layer of a group
            sets its amount, or ``skip``).
        data (iterable): ``taylor``'s and ``activation``'s calibration batches (at most
            ``calib_batches``): tensors, ``(samples, labels)`` tuples, or dicts of named inputs
            with ``"labels"``.
        loss (str): the calibration loss: ``"auto"`` (default), ``"cross-entropy"``, ``"mse"``,
            ``"causal-lm"``, ``"masked-lm"`` (needs ``mask_token``) or
            ``"token-classification"``.
        mask_token (int): ``"masked-lm"``: the [MASK] token's ID.
        calib_batches (int): how many batches of ``data`` to read (default 32).
        device (str): where lopper calibrates and runs the check (default: the module's).
        rtol (float): the check's tolerance, relative to each output's largest magnitude.
        progress (bool): show calibration progress (tqdm when installed, else plain lines).
        reloadable (bool): a transformers model (a ``PreTrainedModel``, passed as it comes: it
            runs without its key/value cache) gets a config that describes the pruned shapes
            (``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, the MLP width under
            the architecture's own key: ``intermediate_size``, GPT-2's ``n_inner``,
            DistilBERT's ``hidden_dim``), checked by building the class from it, so that
            ``save_pretrained`` + ``from_pretrained`` gives back the pruned model. With
            ``reloadable=True`` (the default) a group whose size the config cannot give (heads
            where the head size follows the hidden size, as in GPT-2, BERT and DistilBERT; a
            pooler) is kept whole, and ``scope="global"`` (unequal widths) is refused;
            ``reloadable=False`` prunes them all the same, for a model that is not reloaded with
            ``from_pretrained``.

    Returns:
        StructuredReport: per channel group (``report.groups``: layers, size before and after,
        removed indices, why a group was kept), the parameters and MACs before and after;
        ``str(report)`` is the CLI's table, ``report.to_dict()`` its JSON and
        ``report.save_html(path)`` its HTML page. Its warnings are also issued with
        ``warnings.warn``.

    Raises:
        ValueError: a bad argument (an unknown method or unit, an amount outside [0, 1], a bad
            recipe, example inputs the module rejects).
        TypeError: an argument of the wrong type.
        RuntimeError: the module cannot be exported, no group can be pruned, or no prune that
            keeps the groups in the way gives a module that computes what the pruned graph
            computes (the module is then as it was).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"[prune] module must be a torch.nn.Module, got {type(module).__name__}")
    for name, value in (("unit", unit), ("scope", scope)):
        if not isinstance(value, str):
            raise TypeError(f"[prune] {name} must be a str, got {type(value).__name__}")
    if unit == "expert":  # whole experts of mixture-of-experts layers (_experts.py)
        from lopper import _experts
        return _experts.prune_experts(
            module, example_inputs, method=method, amount=amount, seed=seed, data=data,
            calib_batches=calib_batches, device=device, progress=progress, others=dict(
                scope=scope, max_layer_amount=max_layer_amount, round_to=round_to,
                exclude=exclude, recipe=recipe, loss=loss, mask_token=mask_token, rtol=rtol,
                reloadable=reloadable))
    if unit == "layer":
        for name, value, default in (("scope", scope, "local"), ("recipe", recipe, None),
                                     ("round_to", round_to, 1),
                                     ("max_layer_amount", max_layer_amount, 0.9)):
            if value != default:
                raise ValueError(f"[prune] {name} is for channel and head groups, not "
                                 f"unit='layer' (give amount)")
        return _depth.prune_layers(
            module, example_inputs, method=method, amount=amount, exclude=exclude, seed=seed,
            data=data, calib_batches=calib_batches, device=device, rtol=rtol,
            progress=progress, reloadable=reloadable, loss=loss)
    if isinstance(rtol, bool) or not isinstance(rtol, numbers.Real):
        raise TypeError(f"[prune] rtol must be a float >= 0, got {type(rtol).__name__}")
    if not (math.isfinite(rtol) and rtol >= 0):
        raise ValueError(f"[prune] rtol must be a finite float >= 0, got {rtol}")
    if _pruned(module):
        raise ValueError("[prune] the module carries torch.nn.utils.prune masks: make them "
                         "permanent first (torch.nn.utils.prune.remove) or prune it structured "
                         "before unstructured")
    if not isinstance(reloadable, bool):
        raise TypeError(f"[prune] reloadable must be a bool, got {type(reloadable).__name__}")
    reloadable = reloadable and _hf.is_transformers_model(module)
    if reloadable and scope == "global":
        raise ValueError(
            "[prune] scope='global' gives the layers different widths, which a transformers "
            "config cannot describe (save_pretrained + from_pretrained would not give the model "
            "back): use scope='local', or reloadable=False")
    args, kwargs = _split_inputs(example_inputs, module=module)
    kwargs = _in_signature_order(module, kwargs)
    if device is None:
        first = next(module.parameters(), None)
        device = str(first.device) if first is not None else "cpu"
    options = dict(unit=unit, method=method, amount=amount, scope=scope,
                   max_layer_amount=float(max_layer_amount), round_to=int(round_to),
                   exclude=exclude, seed=seed, recipe=recipe, data=data, loss=loss,
                   mask_token=mask_token, calib_batches=int(calib_batches), device=device)
    _lopper._prune_structured_onnx(b"", check_only=True, **options)  # before the slow export
    leaves = [t.detach().contiguous() for t in _tensors((args, kwargs))]
    holders = _holders(module)
    # NOTE: the module's outputs before come from the torch.fx graph's own run (the module's
    # layers called in its traced order) where _fx writes the module: one forward fewer. The
    # pruned module is checked against the pruned graph all the same, and a graph that does not
    # compute these outputs is replaced by torch.onnx's export (attempt below).
    fx_outputs = []  # the module's outputs, when the export is an unchecked torch.fx graph
    external = []  # its initializers, handed to lopper as tensors (not serialized)
    exported, _ = _export(module, args, kwargs, dynamic=data is not None, fx_outputs=fx_outputs,
                          external=external)
    if exported is None:  # (nothing was put in `external` either)
        before = _check_runs(module, args, kwargs)
        exported, _ = _export(module, args, kwargs, dynamic=data is not None, fx=False)
    else:
        before = list(fx_outputs)
    given = {k: v for k, v in options.items()
             if k in ("unit", "method", "amount", "scope", "round_to", "exclude", "recipe")
             and v is not None and not (k == "round_to" and v == 1)}
    command = "lopper.prune_structured({})".format(", ".join(
        [type(module).__name__] + [f"{k}={v!r}" for k, v in given.items()]))
    fixed = _fixed(module, unit)
    kept_ids = set()

    def prune(kept):
        bar = _Progress("calibrate") if progress and data is not None and not kept else None
        try:
            return _lopper._prune_structured_onnx(
                exported, parameters=list(holders), fixed=fixed, kept=kept, inputs=leaves,
                progress=bar, name=type(module).__name__, command=command,
                initializers=external, **options)
        finally:
            if bar is not None:
                bar.close()

    def attempt(kept, keep=True):
        """Prunes the export with the groups `kept` ({id: why}) kept whole and shrinks the
        module (_shrink_in_place); the report."""
        nonlocal exported, before
        *shrunk, report = prune(kept)
        if fx_outputs:
            # The torch.fx graph is checked by its first prune's run of the unpruned graph: one
            # that does not compute what the module computes is replaced by torch.onnx's export.
            if not _same_outputs(shrunk[1], fx_outputs):
                before = _check_runs(module, args, kwargs)
                external.clear()
                exported, _ = _export(module, args, kwargs, dynamic=data is not None, fx=False)
                *shrunk, report = prune(kept)
            fx_outputs.clear()
        try:
            _shrink_in_place(module, holders, args, kwargs, before, shrunk, rtol, keep,
                             reloadable)
        except _Mismatch as e:
            e.report = report
            raise
        if keep:
            kept_ids.update(kept)
        return report

    first = report = None
    try:
        report = attempt({})
    except _Mismatch as e:
        first = e
    report = _keep_what_the_module_hard_codes(attempt, first) if first is not None else report
    for w in report.warnings:
        warnings.warn(f"[prune] {w}", stacklevel=2)
    for g in report.groups:
        if g.id in kept_ids:
            warnings.warn(f"[prune] group {g.id} ({_label(g)}) kept at {g.size_before} "
                          f"{g.kind}s: {g.blocked}", stacklevel=2)
    return report


_CONFIG_WHY = "the model's config cannot describe its size"


class _Mismatch(RuntimeError):
    """The shrunk module does not compute what lopper's pruned graph computes (it is back as it
    was). `what`: what is in the way; `suspects`: qualified names of the modules and parameters
    where it showed; `report`: the StructuredReport of the prune that led to it; `why`: what a
    group kept for it says."""

    def __init__(self, message, what, suspects, why="its size is hard-coded in the module"):
        super().__init__(message)
        self.what, self.suspects, self.report, self.why = what, suspects, None, why


def _pruned_groups(report):
    return [g for g in report.groups if not g.blocked and g.size_after < g.size_before]


def _label(g):
    names = [p or n for p, n in zip(g.layer_params, g.layers)][:3]
    return ", ".join(names) + (", ..." if len(g.layers) > 3 else "")


def _near(g, suspects):
    """Whether a layer of group g lies in (or is) one of the suspect modules or parameters."""
    return any(s == "" or p == s or p.startswith(s + ".") for p in g.layer_params if p
               for s in suspects)


def _keep_what_the_module_hard_codes(attempt, first):
    """Finds the groups whose size the module's forward() hard-codes and keeps them at their size,
    pruning the rest: `attempt(kept, keep)` prunes with the groups `kept` ({id: why}) kept whole,
    shrinks the module and checks it (raising _Mismatch with the module put back; with
    keep=False, it is put back after a passing check too). The culprits are found by binary
    search over the pruned groups, those near the failure first (a group whose keeping makes the
    check pass, where keeping the groups before it does not): a few prunes per culprit. Returns
    the report of the prune that passes, applied; raises `first` when none does."""
    kept, fail, trials = {}, first, 0

    def passes(ids):
        nonlocal trials
        trials += 1
        if trials > _MAX_TRIALS:
            raise first
        try:
            attempt({**kept, **{i: "kept for a check" for i in ids}}, keep=False)
            return None
        except _Mismatch as e:
            return e
        except RuntimeError as e:
            if "no channel group can be pruned" in str(e):
                return None  # nothing pruned: the module computes what it did
            raise

    while True:
        near = [g.id for g in _pruned_groups(fail.report) if _near(g, fail.suspects)]
        if fail.why == _CONFIG_WHY and near and "" not in fail.suspects:
            # NOTE: a parameter whose size the config cannot give is its groups' doing; no search:
            # keeping some of the groups the config gives one width (MLPs) would fail the check
            # for another reason (uneven widths), which a binary search would blame on the rest.
            for i in near:
                kept[i] = f"{fail.why}: {fail.what}"
            try:
                return attempt(kept, keep=True)
            except _Mismatch as e:
                fail = e
                continue
        pool = [g.id for g in sorted(_pruned_groups(fail.report),
                                     key=lambda g: not _near(g, fail.suspects))]
        if not pool:
            raise first
        # Under a global amount, keeping groups moves their share to others: grow the pool with
        # the groups that then go, until keeping the whole pool passes.
        while (e := passes(pool)) is not None:
            new = [g.id for g in _pruned_groups(e.report) if g.id not in pool]
            if not new:
                raise first
            pool += new
        lo, hi, lo_fail = 0, len(pool), fail
        while hi - lo > 1:
            mid = (lo + hi) // 2
            e = passes(pool[:mid])
            if e is None:
                hi = mid
            else:
                lo, lo_fail = mid, e
        kept[pool[hi - 1]] = f"{lo_fail.why}: {lo_fail.what}"
        try:
            return attempt(kept, keep=True)
        except _Mismatch as e:
            fail = e
        except RuntimeError as e:
            if "no channel group can be pruned" in str(e):
                raise first from None
            raise


# The most prunes _keep_what_the_module_hard_codes tries (each culprit takes about log2(groups)).
_MAX_TRIALS = 64


def _shrink_in_place(module, holders, args, kwargs, before, shrunk, rtol, keep=True,
                     reloadable=False):
    """Puts the pruned export's values into the module and checks it (see prune_structured); with
    keep=False it is put back after the check too. `shrunk`: (values, graph outputs before,
    after, diverged names, gone names) from the C++ side; `before`: the module's own outputs
    before, from _check_runs. Raises _Mismatch with the module as it was."""
    values, graph_before, reference, diverged, gone = shrunk
    for name in list(diverged) + list(gone):
        what = (f"'{name}' is read by layers that shrink differently, and the module holds it "
                "once")
        raise _Mismatch(f"[prune] {what}: exclude one of its layers (exclude=...)", what,
                        [name])
    # The check allows what lopper's executor and PyTorch differ by on the unpruned module (float
    # rounding in another order), ten times over, where that exceeds rtol.
    noise = [_difference(a, b)[0] for a, b in zip(before, graph_before)]
    changes = _apply(module, holders, values, args, kwargs, reference, rtol, noise, reloadable)
    if not keep:
        changes.undo()


def _in_signature_order(module, kwargs):
    """kwargs in the order forward() declares them: the export's inputs come in that order."""
    try:
        order = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return kwargs
    rank = {n: i for i, n in enumerate(order)}
    return dict(sorted(kwargs.items(), key=lambda kv: rank.get(kv[0], len(order))))


def _tensors(tree):
    return [x for x in torch.utils._pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _check_runs(module, args, kwargs):
    """The module's outputs on its example inputs (in eval mode); a ValueError when it rejects
    them (before any export)."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            return _tensors(module(*args, **kwargs))
    except Exception as e:
        raise ValueError(f"[prune] the module fails on the example inputs: {_first_line(e)}") \
            from e
    finally:
        for m, mode in modes:
            m.training = mode


def _holders(module):
    """{parameter or buffer name as the export names it: [(submodule, attribute, kind)]}: every
    submodule that holds it (a tied parameter has several)."""
    by_name, by_id = {}, {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for kind, table in (("param", sub._parameters), ("buffer", sub._buffers)):
            for attr, t in table.items():
                if t is None:
                    continue
                name = f"{prefix}.{attr}" if prefix else attr
                by_name[name] = t
                entry = (sub, attr, kind)
                lst = by_id.setdefault(id(t), [])
                if entry not in lst:
                    lst.append(entry)
    return {name: by_id[id(t)] for name, t in by_name.items()}


def _fixed(module, unit):
    """(parameter, axis, why) that must keep their size: what a module's forward cannot follow."""
    out = []
    for prefix, sub in module.named_modules():
        dim_attr, head_dim = _first_attr(sub, _HEAD_DIM)
        if unit == "channel" and dim_attr is not None:
            # Channel pruning would narrow every head; the module reshapes by its head_dim.
            why = (f"{type(sub).__name__} '{prefix}' keeps its {dim_attr} ({head_dim}: its forward "
                   "reshapes by it); its heads go with unit='head'")
            for child, proj in sub.named_children():
                if child in _QUERY + _KEY + _VALUE + _FUSED_QKV:
                    for pname, p in proj.named_parameters(recurse=False):
                        axis = 1 if type(proj).__name__ == "Conv1D" and pname == "weight" else 0
                        out.append((f"{prefix}.{child}.{pname}", axis, why))
        if isinstance(sub, torch.nn.MultiheadAttention):
            why = (f"nn.MultiheadAttention '{prefix}' keeps its embed_dim and heads (its forward "
                   "computes head_dim as embed_dim // num_heads)")
            for name, _ in sub.named_parameters():
                out.append((f"{prefix}.{name}" if prefix else name, -1, why))
        elif isinstance(sub, torch.nn.RNNBase):
            why = (f"{type(sub).__name__} '{prefix}' keeps its input_size and hidden_size (lopper "
                   "does not shrink recurrent layers)")
            for name, _ in sub.named_parameters():
                out.append((f"{prefix}.{name}" if prefix else name, -1, why))
    return out


_STANDARD = (torch.nn.modules.conv._ConvNd, torch.nn.Linear, torch.nn.modules.batchnorm._NormBase,
             torch.nn.GroupNorm, torch.nn.LayerNorm, torch.nn.Embedding, torch.nn.EmbeddingBag,
             torch.nn.PReLU)


class _Changes:
    """What _apply changed, to put back exactly: tensors' data, grads, buffers, attributes."""

    def __init__(self):
        self.data, self.grads, self.buffers, self.attrs = [], [], [], []
        self.modules = {}  # id -> a submodule whose parameters or buffers shrank

    def set_attr(self, sub, attr, value):
        old = getattr(sub, attr, _Changes)  # _Changes: there was none (a config's new key)
        if old == value:
            return
        self.attrs.append((sub, attr, old))
        setattr(sub, attr, value)

    def undo(self):
        for sub, attr, old in reversed(self.attrs):
            if old is _Changes:
                delattr(sub, attr)
            else:
                setattr(sub, attr, old)
        for sub, attr, old in reversed(self.buffers):
            sub._buffers[attr] = old
        for p, old in reversed(self.grads):
            p.grad = old
        for p, old in reversed(self.data):
            p.data = old


def _apply(module, holders, values, args, kwargs, reference, rtol, noise, reloadable):
    changes = _Changes()
    sizes = {}   # old size -> new size of every axis that shrank, to name attributes in the way
    try:
        with torch.no_grad():
            for name, value in values.items():
                entries = holders[name]
                sub0, attr0, kind = entries[0]
                old = getattr(sub0, attr0)
                for a, b in zip(old.shape, value.shape):
                    if a != b:
                        sizes.setdefault(int(a), int(b))
                new = value.to(device=old.device, dtype=old.dtype)
                if kind == "param":
                    changes.data.append((old, old.data))
                    if old.grad is not None:
                        changes.grads.append((old, old.grad))
                        old.grad = None
                    old.data = new
                else:
                    for sub, attr, _ in entries:
                        changes.buffers.append((sub, attr, sub._buffers[attr]))
                        sub._buffers[attr] = new
                for sub, _, _ in entries:
                    changes.modules[id(sub)] = sub
        for prefix, sub in module.named_modules():
            if id(sub) in changes.modules:
                _update_sizes(sub, changes)
        for prefix, sub in module.named_modules():
            _update_heads(sub, changes)
        _check(module, args, kwargs, reference, rtol, noise, sizes, changes)
        if reloadable:
            problem = _hf.follow_config(module, _ATTENTION_NAMES, changes.set_attr)
            if problem is not None:
                what, suspect = problem
                raise _Mismatch(
                    f"[prune] {what}: save_pretrained + from_pretrained would not give the pruned "
                    "model back (reloadable=False prunes it all the same)", what, [suspect],
                    _CONFIG_WHY)
    except BaseException:
        changes.undo()
        raise
    return changes


def _update_sizes(sub, changes):
    """The sizes a standard module keeps as attributes, from its parameters' new shapes."""
    w = getattr(sub, "weight", None)
    nn = torch.nn
    if isinstance(sub, nn.modules.conv._ConvNd) and w is not None:
        g = sub.groups
        if isinstance(sub, nn.modules.conv._ConvTransposeNd):
            changes.set_attr(sub, "in_channels", w.shape[0])
            changes.set_attr(sub, "out_channels", w.shape[1] * g)
            return
        # A depthwise convolution (one input channel per group) loses groups with its channels;
        # any other grouped one loses channels from every group alike.
        if g > 1 and sub.in_channels == g:
            mult = sub.out_channels // g
            g = w.shape[0] // mult
            changes.set_attr(sub, "groups", g)
        changes.set_attr(sub, "in_channels", w.shape[1] * g)
        changes.set_attr(sub, "out_channels", w.shape[0])
    elif isinstance(sub, nn.Linear) and w is not None:
        changes.set_attr(sub, "in_features", w.shape[1])
        changes.set_attr(sub, "out_features", w.shape[0])
    elif isinstance(sub, (nn.modules.batchnorm._NormBase)):
        t = w if w is not None else getattr(sub, "running_mean", None)
        if t is not None:
            changes.set_attr(sub, "num_features", t.shape[0])
    elif isinstance(sub, nn.GroupNorm) and w is not None:
        changes.set_attr(sub, "num_channels", w.shape[0])
    elif isinstance(sub, (nn.LayerNorm, getattr(nn, "RMSNorm", nn.LayerNorm))) and w is not None:
        changes.set_attr(sub, "normalized_shape", tuple(w.shape))
    elif isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and w is not None:
        changes.set_attr(sub, "num_embeddings", w.shape[0])
        changes.set_attr(sub, "embedding_dim", w.shape[1])
    elif isinstance(sub, nn.PReLU) and w is not None:
        changes.set_attr(sub, "num_parameters", w.numel())
    elif type(sub).__name__ == "Conv1D" and w is not None and hasattr(sub, "nf"):
        # transformers' Conv1D (GPT-2): weight [in, out]
        changes.set_attr(sub, "nf", w.shape[1])
        if hasattr(sub, "nx"):
            changes.set_attr(sub, "nx", w.shape[0])


def load_pruned(module, state_dict, strict=True):
    """Loads ``state_dict``, saved from a module that ``lopper.prune_structured`` shrank, into a
    fresh instance of its class (``module``, as its constructor made it): every parameter and
    buffer first takes the saved shape, the layers' sizes follow as ``prune_structured`` sets
    them (``in_features``, ``out_channels``, ``groups``, ``num_features``, ``normalized_shape``,
    transformers' head counts, ...), then ``module.load_state_dict(state_dict, strict=strict)``.
    What Torch-Pruning's ``tp.load_state_dict`` does, from the shapes alone. A transformers model
    needs none of this: its config follows the pruning and ``from_pretrained`` rebuilds it.

    Returns:
        module, pruned as the saved one was.

    Raises:
        TypeError: ``module`` is not a torch.nn.Module or ``state_dict`` not a mapping.
        ValueError: a saved tensor has another rank than the module's, or is larger along an
            axis (not a pruning of this architecture); ``module`` is then left as it was, as it
            is when ``load_state_dict`` refuses the state dict.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"[load_pruned] module must be a torch.nn.Module, got "
                        f"{type(module).__name__}")
    if not hasattr(state_dict, "items"):
        raise TypeError(f"[load_pruned] state_dict must be a mapping of tensors, got "
                        f"{type(state_dict).__name__}")
    own = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for kind, tensors in (("param", sub._parameters), ("buffer", sub._buffers)):
            for attr, t in tensors.items():
                if t is not None:
                    own.setdefault(f"{prefix}.{attr}" if prefix else attr, []).append(
                        (sub, attr, kind))
    changes = _Changes()
    done = set()
    try:
        with torch.no_grad():
            for name, saved in state_dict.items():
                if name not in own or not isinstance(saved, torch.Tensor):
                    continue  # load_state_dict says what does not fit
                sub, attr, kind = own[name][0]
                old = getattr(sub, attr)
                if tuple(old.shape) == tuple(saved.shape) or id(old) in done:
                    continue
                if old.dim() != saved.dim() or any(b > a for a, b in zip(old.shape, saved.shape)):
                    raise ValueError(f"[load_pruned] {name} was saved as {list(saved.shape)}, the "
                                     f"module's is {list(old.shape)}: not a pruning of it")
                done.add(id(old))
                new = torch.empty(saved.shape, dtype=old.dtype, device=old.device)
                if kind == "param":
                    changes.data.append((old, old.data))
                    old.data = new
                else:
                    for s, a, _ in own[name]:
                        changes.buffers.append((s, a, s._buffers[a]))
                        s._buffers[a] = new
                for s, _, _ in own[name]:
                    changes.modules[id(s)] = s
            for sub in module.modules():
                if id(sub) in changes.modules:
                    _update_sizes(sub, changes)
            for sub in module.modules():
                _update_heads(sub, changes)
            module.load_state_dict(state_dict, strict=strict)
    except BaseException:
        changes.undo()
        raise
    return module


_out_features = _hf.out_features
_first_attr = _hf.first_attr


def _update_heads(sub, changes):
    """Head counts of an attention module (transformers' naming), from its projections."""
    heads_attr, heads = _first_attr(sub, _HEADS)
    dim_attr, head_dim = _first_attr(sub, _HEAD_DIM)
    if heads_attr is None or dim_attr is None or head_dim <= 0:
        return
    children = dict(sub.named_children())
    q = next((children[n] for n in _QUERY if n in children), None)
    fused = next((children[n] for n in _FUSED_QKV if n in children), None)
    if q is not None and _out_features(q) is not None:
        new_heads = _out_features(q) // head_dim
    elif fused is not None and _out_features(fused) is not None:
        kv_attr, kv = _first_attr(sub, _KV_HEADS)
        per = _out_features(fused) // head_dim  # heads + 2 kv heads
        new_heads = per // 3 if kv_attr is None or kv == heads else None
        if new_heads is None:
            return
    else:
        return
    if new_heads == heads:
        return
    old_inner = heads * head_dim
    changes.set_attr(sub, heads_attr, new_heads)
    kv_attr, kv = _first_attr(sub, _KV_HEADS)
    k = next((children[n] for n in _KEY if n in children), None)
    new_kv = kv
    if kv_attr is not None and k is not None and _out_features(k) is not None:
        new_kv = _out_features(k) // head_dim
        changes.set_attr(sub, kv_attr, new_kv)
    if "num_key_value_groups" in sub.__dict__ and new_kv:
        changes.set_attr(sub, "num_key_value_groups", new_heads // new_kv)
    for attr in ("all_head_size", "inner_dim", "split_size"):
        v = sub.__dict__.get(attr)
        if isinstance(v, int) and v == old_inner:
            changes.set_attr(sub, attr, new_heads * head_dim)


def _difference(a, b):
    """(max |a - b|, max |b|) of two tensors, in float64 (exact for integers)."""
    b = b.to(a.device)
    if a.numel() == 0 or a.shape != b.shape:
        return 0.0, 0.0
    a64, b64 = a.double(), b.double()
    return float((a64 - b64).abs().max()), float(b64.abs().max())


def _check(module, args, kwargs, reference, rtol, noise, sizes, changes):
    """The shrunk module's outputs against the pruned graph's; a RuntimeError naming what is in
    the way otherwise."""
    modes = [(m, m.training) for m in module.modules()]
    stack, failed_in = [], []
    names = {id(m): n for n, m in module.named_modules()}

    def enter(m, _):
        stack.append(m)

    def leave(m, _, __):
        if stack and stack[-1] is m:
            stack.pop()

    hooks = []
    for m in module.modules():
        hooks.append(m.register_forward_pre_hook(enter))
        hooks.append(m.register_forward_hook(leave))
    module.eval()
    problem = None
    try:
        with torch.no_grad():
            try:
                got = _tensors(module(*args, **kwargs))
            except Exception as e:
                failed_in.extend(stack)
                problem = _first_line(e)
                got = None
    finally:
        for h in hooks:
            h.remove()
        for m, mode in modes:
            m.training = mode
    if problem is None:
        if len(got) != len(reference):
            problem = f"it returns {len(got)} tensors, the pruned graph {len(reference)}"
        else:
            for i, (a, b) in enumerate(zip(got, reference)):
                b = b.to(a.device)
                if tuple(a.shape) != tuple(b.shape):
                    problem = (f"output {i} has shape {list(a.shape)}, the pruned graph's "
                               f"{list(b.shape)}")
                    break
                err, scale = _difference(a, b)
                allowed = max(rtol * scale, 10 * (noise[i] if i < len(noise) else 0.0))
                if not err <= allowed:
                    problem = (f"output {i} differs from the pruned graph's by {err:.3g} (more "
                               f"than {allowed:.3g})")
                    break
    if problem is None:
        return
    where, suspects = _in_the_way(module, failed_in, sizes, names, changes)
    raise _Mismatch(
        f"[prune] the shrunk module does not compute what lopper's pruned graph computes "
        f"({problem}): {where}; the module is back as it was: exclude its layers "
        f"(exclude=...) or keep that size in its attributes", f"{where} ({problem})", suspects)


def _in_the_way(module, failed_in, sizes, names, changes):
    """The module and attribute that still hold a pruned size (a forward that hard-codes it), and
    the names of the modules where the failure showed (innermost first)."""
    updated = {(id(s), a) for s, a, _ in changes.attrs}
    shrunk = changes.modules
    # The modules running when forward failed (innermost first), then those that hold a module
    # that shrank (deepest first); the standard modules' sizes were updated above.
    holding = [m for _, m in sorted(module.named_modules(), key=lambda nm: -nm[0].count("."))
               if any(id(c) in shrunk for c in m.modules())]
    order = list(reversed(failed_in)) + [m for m in holding if m not in failed_in]
    for m in order:
        if isinstance(m, _STANDARD):
            continue
        for attr, v in vars(m).items():
            if attr.startswith("_") or (id(m), attr) in updated:
                continue
            values = v if isinstance(v, (tuple, list)) else [v]
            for x in values:
                if isinstance(x, int) and not isinstance(x, bool) and x in sizes:
                    return (f"module '{names.get(id(m), '?')}' ({type(m).__name__}) attribute "
                            f"'{attr}' = {v} is a size that pruning changed ({x} -> {sizes[x]})",
                            [names.get(id(m), "")])
    suspects = [names.get(id(m), "") for m in reversed(failed_in)]
    if failed_in:
        m = failed_in[-1]
        return (f"module '{names.get(id(m), '?')}' ({type(m).__name__}) fails in its forward(), "
                "which hard-codes a size pruning changed", suspects)
    return "no module attribute holds a pruned size (a forward() hard-codes one)", suspects
