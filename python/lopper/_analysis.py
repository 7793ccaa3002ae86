"""lopper.sensitivity and lopper.prune_to_target: how much each layer of an nn.Module can lose, and
pruning it to a share of its parameters or MACs, or to a latency.

The module is exported to ONNX in memory (as lopper.prune does); lopper's C++ library measures
the sweep and chooses the amounts on the export exactly as `lopper sensitivity` and `lopper prune
--target-*` do, and hands back a keep-mask per pruned weight, applied with
torch.nn.utils.prune.custom_from_mask, and the new values of the weights whose kept entries a
sparsegpt target changed, copied into the parameters first (lopper.prune's _apply). This file only
moves the module and the data across.
"""
import inspect
import warnings

import torch

from lopper import _hf, _lopper, _prune, _structured
from lopper._lopper import (  # noqa: F401 (re-exported)
    SensitivityLayer, SensitivityPoint, SensitivityReport, TargetLayer, TargetReport)

__all__ = ["SensitivityLayer", "SensitivityPoint", "SensitivityReport", "TargetLayer",
           "TargetReport", "prune_to_target", "sensitivity"]


def sensitivity(module, example_inputs, data, *, structured=False, method="l1", amounts=None,
                eval_batches=16, round_to=1, exclude=None, seed=None, allow_tied=False,
                loss="auto", mask_token=None, device=None, calib_batches=None, block_size=None,
                dampening=None, progress=True):
    """Measures how much each layer of ``module`` (or each channel group) costs when it alone is
    pruned, the way ``lopper sensitivity`` measures its ONNX export. The module is not modified.

    The module is evaluated on the first ``eval_batches`` batches of ``data`` (mean loss and
    top-1), then once per prunable layer (every Conv, ConvTranspose and Linear weight: any
    parameter a convolution or a matrix product reads) and amount, with only that layer pruned:
    its smallest weights zeroed (``structured=False``), or the least important channels of its
    channel group removed (``structured=True``: the layers whose channels must go together, as
    ``lopper.prune_structured`` removes them). The curves say where the module can be pruned and
    how far; ``prune_to_target(..., sensitivity=report)`` chooses per-layer amounts from them.

    With ``method="wanda"`` or ``"sparsegpt"`` each point prunes its layer as ``lopper.prune(...,
    method=..., data=...)`` prunes it, by the inputs the layer sees: those are collected once, on
    the unpruned module, over the first ``calib_batches`` batches of ``data`` (only one layer is
    pruned at a time, so no layer's inputs change); SparseGPT's updated weights are evaluated, not
    only its zeros. Layers whose inputs cannot be collected are left out and named in
    ``report.skipped``.

    Args:
        module (torch.nn.Module): the model; it must export with ``torch.onnx.export(...,
            dynamo=True)`` on ``example_inputs`` (in eval mode; its modes are put back).
        example_inputs: what ``module`` is called with: a tensor, a tuple of positional
            arguments, or a dict of keyword arguments. MACs are counted at its shapes.
        data (iterable): the evaluation batches (at most ``eval_batches`` are read, each as
            given, the same ones at every point): tensors of samples, ``(samples, labels)``
            tuples, or dicts of named inputs (the forward's argument names) with ``"labels"``,
            as torch DataLoaders and transformers collators give them.
        structured (bool or str): channel groups instead of single weights (``True`` or
            ``"channel"``), each residual block (decoder layer) of the export removed alone
            (``"block"``: one point per block, amount 1), or both (``"channel,block"``); default
            False. ``"expert"``: each MoE layer of a transformers model loses each share of its
            experts alone, in place and without an export (see docs/python.md; ``method``
            ``"reap"``, the default here, ``"frequency"``, ``"activation"`` or ``"random"``).
        method (str): what ranks the weights: ``"l1"`` (default, |w|), ``"random"`` (seeded),
            ``"wanda"`` or ``"sparsegpt"`` (by the layers' inputs on ``data``, see
            ``lopper.prune``); with ``structured``, the channels: ``"l1"``, ``"l2"``, ``"bn"``,
            ``"fpgm"`` or ``"random"``.
        amounts (list of float): the shares removed, each in [0, 1) (default 0.1, 0.2, ...,
            0.9, 0.95).
        eval_batches (int): batches of ``data`` evaluated per point (default 16).
        round_to (int): ``structured``: keep channel counts a multiple of this (default 1).
        exclude (str): leave out the layers (or groups with a layer) whose node, weight or
            parameter name (e.g. ``"fc1.weight"``) matches this regular expression
            (ECMAScript, searched).
        seed (int): ``random``: the seed; masked-LM: which tokens are masked (default 0).
        allow_tied (bool): analyse tied weights too (one that a non-layer also reads, e.g.
            GPT-2's lm_head and its token embedding); off, they are left out.
        loss (str): the loss on the first output: ``"auto"`` (default: cross-entropy for
            labels [B], token classification for [B, T], next-token prediction for a language
            model without labels), ``"cross-entropy"``, ``"mse"``, ``"causal-lm"``,
            ``"masked-lm"`` (needs ``mask_token``) or ``"token-classification"``.
        mask_token (int): ``"masked-lm"``: the [MASK] token's ID.
        device (str): where the sweep runs: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (default: the
            module's device).
        calib_batches (int): ``wanda``, ``sparsegpt``: how many of the first batches of ``data``
            the layers' inputs are collected on, at most (default: the papers' 128 samples,
            ``ceil(128 / B)`` batches of the first batch's size B, as ``lopper.prune``). The
            points are evaluated on the first ``eval_batches`` of the same batches.
        block_size (int): ``sparsegpt``: columns pruned and updated together (default 128).
        dampening (float): ``sparsegpt``: added to the Hessian's diagonal as a fraction of its
            mean (default 0.01); > 0.
        progress (bool): show the sweep's progress on stderr (tqdm when installed, else a few
            plain lines).

    Returns:
        SensitivityReport: ``report.loss`` and ``report.top1`` (the unpruned module), and per
        layer ``report.layers`` with its ``points`` (amount, removed, loss, top1, params,
        macs); ``report.skipped`` the layers ``wanda`` or ``sparsegpt`` could not analyse,
        with why; ``str(report)`` is the CLI's table, ``report.to_dict()`` its JSON and
        ``report.save_html(path)`` its HTML page.

    Note:
        The report keeps the export (a copy of the module's weights) for ``save_html``, which
        measures its latency; deleting the report frees it.

    Raises:
        ValueError: a bad argument, with lopper's one-line message (an unknown method, an
            amount outside [0, 1), no data, an exclude that is not a regex, ``calib_batches``
            with a method other than ``wanda`` and ``sparsegpt``, ``block_size`` or
            ``dampening`` with one other than ``sparsegpt``, ``block_size`` < 1, ``dampening``
            <= 0).
        TypeError: an argument of the wrong type.
        RuntimeError: the module cannot be exported, or lopper cannot run its export on the
            data (an unsupported op, batches the module cannot take, no layer to analyse).
    """
    if isinstance(structured, str) and structured == "expert":  # MoE experts, in place
        from lopper import _experts
        return _experts.sweep_experts(
            module, example_inputs, data, method=None if method == "l1" else method,
            amounts=amounts, eval_batches=eval_batches, seed=seed, loss=loss,
            calib_batches=calib_batches, device=device, progress=progress, others=dict(
                round_to=round_to, exclude=exclude, allow_tied=allow_tied,
                mask_token=mask_token, block_size=block_size, dampening=dampening))
    _prune._check_module(module, "sensitivity")
    args, kwargs = _prune._split_inputs(example_inputs, "sensitivity", module)
    if device is None:
        device = _prune._module_device(module)

    def export():
        exported, holders = _prune._export(module, args, kwargs, dynamic=True, op="sensitivity")
        return exported, list(holders)

    options = dict(structured=structured, method=method, amounts=amounts,
                   eval_batches=eval_batches, round_to=round_to, exclude=exclude, seed=seed,
                   allow_tied=allow_tied, loss=loss, mask_token=mask_token, device=device,
                   calib_batches=calib_batches, block_size=block_size, dampening=dampening)
    command = _command("sensitivity", module, options, sensitivity)
    with _Bars(progress) as bars:
        return _lopper._sensitivity(export, data, **options,
                                    example=_prune._example_shapes(module, args, kwargs),
                                    progress=bars.callback, name=type(module).__name__,
                                    command=command,
                                    fixed=_structured._fixed(module, "channel") if structured
                                    else [])


def prune_to_target(module, example_inputs, *, macs=None, params=None, latency_ms=None,
                    structured=False, data=None, sensitivity=None, method="l1", round_to=1,
                    exclude=None, allow_tied=False, eval_batches=16, loss="auto",
                    mask_token=None, device=None, calib_batches=None, block_size=None,
                    dampening=None, progress=True):
    """Prunes ``module`` in place until it keeps a share of its parameters or MACs, or runs within
    a latency, with the least estimated loss: what ``lopper prune --target-*`` does to its ONNX
    export.

    Per-layer amounts are chosen from sensitivity curves (``sensitivity``, or measured on
    ``data`` as ``lopper.sensitivity`` measures them) so that the sum of the layers' estimated
    loss increases is smallest; without either, weights are ranked across layers by LAMP and the
    one amount that meets the target is found. The pruned export is then measured, and the
    amounts corrected until the measurement meets the target. The chosen zeros are applied with
    ``torch.nn.utils.prune.custom_from_mask``, as ``lopper.prune`` applies its own: each pruned
    submodule gains ``weight_orig`` and ``weight_mask``, a training loop keeps the zeros, and
    ``torch.nn.utils.prune.remove`` makes them permanent.

    With ``method="wanda"`` or ``"sparsegpt"`` the amounts are chosen on that method's own
    sensitivity curves (``sensitivity`` measured with it, or measured on ``data``), then the
    module is pruned by it, each layer to its amount, as ``lopper.prune(..., method=...,
    data=...)`` prunes: calibrated block by block on ``data``. SparseGPT also updates the weights
    it keeps: their new values are copied into the parameters before the masks are applied, as
    ``lopper.prune`` copies them.

    Args:
        module (torch.nn.Module): the model (see ``lopper.prune``); untouched when anything
            fails.
        example_inputs: what ``module`` is called with: a tensor, a tuple of positional
            arguments, or a dict of keyword arguments. MACs and latency are those of a call on
            it.
        macs (float): the share of the module's MACs kept, in (0, 1) (MACs on nonzero weights:
            what a sparse kernel computes).
        params (float): the share of its nonzero parameters kept, in (0, 1).
        latency_ms (float): milliseconds per call on ``example_inputs`` on ``device``, as
            lopper's executor runs the export. Exactly one of ``macs``, ``params`` and
            ``latency_ms``.
        structured (bool): remove whole channels instead of single weights: the module
            shrinks in place as ``lopper.prune_structured`` shrinks it (its parameters and
            buffers sliced by name, the standard modules' sizes updated, the result checked
            against lopper's pruned export, everything put back on a mismatch).
        data (iterable): batches to measure the sensitivity curves on (as ``lopper.sensitivity``
            reads them); the pruned module's loss and top-1 are then measured on them too. With
            ``sensitivity``: the module's loss and top-1 before and after, measured on them.
            ``wanda``, ``sparsegpt``: required, and also the calibration batches (as
            ``lopper.prune`` reads them: a smaller last batch left out); with ``sensitivity``
            only those. Without ``sensitivity`` it is read twice, once for the calibration and
            once for the sweep: a list or a DataLoader, not an iterator (a generator).
        sensitivity (SensitivityReport): curves measured before on this module by
            ``lopper.sensitivity`` (instead of measuring them on ``data``; with ``wanda`` or
            ``sparsegpt``, measured with the same method).
        method (str): how single weights are pruned: ``"l1"`` (default, by magnitude),
            ``"wanda"`` or ``"sparsegpt"`` (see ``lopper.prune``; they need ``data``).
        round_to (int): structured: keep channel counts a multiple of this (default 1).
        exclude (str): leave alone the layers whose node, weight or parameter name matches this
            regular expression (ECMAScript, searched).
        allow_tied (bool): prune tied weights too (see ``lopper.prune``).
        eval_batches (int): batches of ``data`` evaluated per point (default 16).
        loss (str): the loss on ``data`` (see ``lopper.sensitivity``; default ``"auto"``).
        mask_token (int): ``"masked-lm"``: the [MASK] token's ID.
        device (str): where the sweep and the latency run: ``"cpu"``, ``"cuda"``, ``"cuda:N"``
            (default: the module's device).
        calib_batches (int): ``wanda``, ``sparsegpt``: how many batches of ``data`` to calibrate
            on, at most (default: the papers' 128 samples, as ``lopper.prune``); a sweep on
            ``data`` collects the layers' inputs on the same batches.
        block_size (int): ``sparsegpt``: columns pruned and updated together (default 128).
        dampening (float): ``sparsegpt``: the Hessian's dampening (default 0.01); > 0.
        progress (bool): show progress on stderr (tqdm when installed, else a few plain lines).

    Returns:
        TargetReport: the amount chosen per layer (``report.layers``), the target and how it was
        met (goal, before, predicted, measured), the parameters and MACs before and after;
        ``str(report)`` is the CLI's table, ``report.to_dict()`` its JSON and
        ``report.save_html(path)`` its HTML page. Its warnings (a latency over the target, a
        busy machine) are also issued with ``warnings.warn``.

    Note:
        The report keeps the export before and after pruning (the pruned weights are new
        tensors, the others shared) for ``save_html``, which measures their latency; deleting
        the report frees them.

    Raises:
        ValueError: a bad argument, with lopper's one-line message (no target or several, a
            share outside (0, 1), a method other than l1, wanda and sparsegpt, both data and
            sensitivity with l1, wanda or sparsegpt without data, a sensitivity of another
            module or unit or, with wanda or sparsegpt, measured with another method,
            ``calib_batches`` with l1, ``block_size`` or ``dampening`` with a method other than
            sparsegpt, an iterator as ``data`` that wanda or sparsegpt would read twice).
        TypeError: an argument of the wrong type.
        RuntimeError: the module cannot be exported or run, or the target cannot be reached
            (every layer at its largest amount is not enough).
    """
    _prune._check_module(module, "prune")
    args, kwargs = _prune._split_inputs(example_inputs, "prune", module)
    if device is None:
        device = _prune._module_device(module)
    holders = {}
    extra = {}
    if structured:
        # The module shrinks in place: its tensors (buffers too) are taken by name, what its
        # forward cannot follow is pinned, and it is checked against the pruned export.
        kwargs = _structured._in_signature_order(module, kwargs)
        before = _structured._check_runs(module, args, kwargs)
        extra = dict(fixed=_structured._fixed(module, "channel"),
                     inputs=[t.detach().contiguous() for t in _structured._tensors((args, kwargs))])

    def export():
        # NOTE: a sensitivity report's channel groups are numbered in its own export, which is
        # dynamic: the same export here numbers them alike.
        dynamic = data is not None or sensitivity is not None
        exported, held = _prune._export(module, args, kwargs, dynamic=dynamic)
        if structured:
            held = _structured._holders(module)
        holders.update(held)
        return exported, list(held)

    options = dict(macs=macs, params=params, latency_ms=latency_ms, structured=structured,
                   data=data, sensitivity=sensitivity, method=method, round_to=round_to,
                   exclude=exclude, allow_tied=allow_tied, eval_batches=eval_batches, loss=loss,
                   mask_token=mask_token, device=device, calib_batches=calib_batches,
                   block_size=block_size, dampening=dampening)
    command = _command("prune_to_target", module, options, prune_to_target)
    with _Bars(progress) as bars:
        result, values, report = _lopper._prune_to_target(
            export, **options, example=_prune._example_shapes(module, args, kwargs),
            progress=bars.callback, name=type(module).__name__, command=command, **extra)
    if structured:
        _structured._shrink_in_place(module, holders, args, kwargs, before, result, 1e-4)
        # A transformers model's config follows where it can describe the widths a target chose.
        problem = _hf.follow_config(module, _structured._ATTENTION_NAMES, setattr)
        if problem is not None:
            warnings.warn(f"[prune] {problem[0]}: save_pretrained + from_pretrained would not give "
                          "the pruned model back", stacklevel=2)
    else:
        _prune._apply(result, values, holders)
    for w in report.warnings:
        warnings.warn(f"[prune] {w}", stacklevel=2)
    return report


def _command(op, module, options, fn):
    """The call, for a report's header: lopper.OP(ModuleClass, arguments that differ from the
    defaults)."""
    defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items()}
    parts = [type(module).__name__]
    for k, v in options.items():
        if k in defaults and defaults[k] is not inspect.Parameter.empty and v is defaults[k]:
            continue
        if k in defaults and v == defaults[k] and not isinstance(v, torch.Tensor):
            continue
        if k == "device" and v == _prune._module_device(module):
            continue
        simple = isinstance(v, (str, int, float, bool)) or (
            isinstance(v, (list, tuple)) and all(isinstance(a, (int, float)) for a in v))
        text = repr(v) if simple else f"<{type(v).__name__}>"
        parts.append(f"{k}={text}")
    return f"lopper.{op}({', '.join(parts)})"


class _Bars:
    """lopper's progress(label, done, total, what) as _prune._Progress bars: one per label (a
    target measures its sensitivity first), each closed when the next begins."""

    def __init__(self, enabled):
        self.enabled = enabled
        self.label = None
        self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def callback(self):
        return self if self.enabled else None

    def __call__(self, label, done, total, what):
        if label != self.label:
            self.close()
            self.label = label
            self.bar = _prune._Progress(label)
        self.bar(done, total, what)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        self.bar = None
        self.label = None
