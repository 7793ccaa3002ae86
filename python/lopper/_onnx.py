"""lopper.export_onnx: an nn.Module (a pruned one, a transformers model as it comes) written as an
ONNX file with its weights in an external data file beside it, for lopper's runtime (its sparse
kernels take the zeros) or any other.

The graph is _prune._export's (the torch.fx writer where it applies, else torch.onnx.export),
with every torch.nn.utils.prune mask made permanent in a copy: the module is not modified. The
file is checked before it is put in place: lopper's executor runs it on the example inputs and
must give the module's own outputs. Everything is written into a temporary folder beside the
destination and renamed into place, the data file first.
"""
import os
import shutil
import tempfile

import torch

from lopper import _lopper, _prune

__all__ = ["export_onnx"]

# The torch.fx writer serialises the whole model into one protobuf: only below this size.
_FX_LIMIT = 1 << 30
# Tensors up to this size stay in the graph (shape constants, axes: what shape inference reads).
_INLINE_BYTES = 1024
# The model's metadata key that lists (as a JSON array) the initializers that are the module's
# buffers, not its parameters: `lopper train` leaves them as PyTorch's optimisers do (RoPE's
# inv_freq, say). lopper's trainer reads it (src/train/trainer.cpp).
BUFFERS_KEY = "lopper.buffers"


def export_onnx(module, example_inputs, path, *, dynamic=True, check=True):
    """Writes ``module`` as an ONNX file at ``path``, its weights in ``PATH.data`` beside it (ONNX
    external data: any size, where one protobuf stops at 2 GB; tensors up to 1 KB stay in the
    graph), for ``lopper run``, ``lopper bench``, ``lopper.InferenceSession`` and any ONNX
    runtime.

    A module that ``lopper.prune`` masked is written with its masks made permanent (the zeros
    kept, in a copy: the module keeps its masks), so lopper's sparse kernels compute only its
    nonzero weights. A transformers model is exported without its key/value cache (its config is
    left as it is); its outputs (``logits``, ...) are the file's.

    The file's metadata (``lopper.buffers``) names the initializers that are the module's buffers
    (a rotary embedding's ``inv_freq``, say), so that ``lopper train`` and ``lopper finetune``
    leave them as PyTorch's optimisers do: they train parameters only.

    Args:
        module (torch.nn.Module): the model (in eval mode for the export; its modes are put back).
        example_inputs: what ``module`` is called with: a tensor, a tuple of positional
            arguments, or a dict of keyword arguments (e.g. ``{"input_ids": ...,
            "attention_mask": ...}``). The file's inputs are the forward's argument names.
        path (str or os.PathLike): the ONNX file; its folder must exist. An existing file there
            (and its ``.data``) is replaced, only once the new one is complete and checked.
        dynamic (bool): the batch dimension (and every dimension of an integer input: token ids,
            masks) dynamic where the module allows it (default True); else the example's shapes.
        check (bool): run the written file with lopper's executor on ``example_inputs`` and
            require the module's outputs (to 1e-4 of each output's largest magnitude) before it
            is put in place (default True).

    Returns:
        str: ``path``.

    Raises:
        TypeError: ``module`` is not a torch.nn.Module, or ``path`` is not a path.
        FileNotFoundError: ``path``'s folder does not exist.
        RuntimeError: the module does not export to ONNX, or (``check``) lopper cannot run the
            file or computes other outputs from it; nothing is written.
    """
    _prune._check_module(module, "export_onnx")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"[export_onnx] path must be a str or os.PathLike, got "
                        f"{type(path).__name__}")
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"[export_onnx] the folder of '{path}' does not exist")
    args, kwargs = _prune._split_inputs(example_inputs, "export_onnx", module)
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    fx = size < _FX_LIMIT and not kwargs
    expected = _outputs(module, args, kwargs) if check else None
    base = os.path.basename(path)
    data = base + ".data"
    temp = tempfile.mkdtemp(prefix=".lopper-export-", dir=folder)
    try:
        buffers = {name for name, _ in module.named_buffers()}
        model, _ = _prune._export_model(module, args, kwargs, dynamic, op="export_onnx", fx=fx)
        _write(model, os.path.join(temp, base), data, buffers)
        del model
        if check:
            problem = _check(os.path.join(temp, base), module, args, kwargs, expected)
            if problem is not None and fx:
                # NOTE: a torch.fx graph is used only where lopper computes the module from it
                # (_export checked the bytes); one that does not from the file is not either.
                model, _ = _prune._export_model(module, args, kwargs, dynamic, op="export_onnx",
                                                fx=False)
                _write(model, os.path.join(temp, base), data, buffers)
                del model
                problem = _check(os.path.join(temp, base), module, args, kwargs, expected)
            if problem is not None:
                raise RuntimeError(f"[export_onnx] {problem}; nothing written (check=False "
                                   "writes the export unchecked)")
        if os.path.exists(os.path.join(temp, data)):
            os.replace(os.path.join(temp, data), os.path.join(folder, data))
        elif os.path.isfile(os.path.join(folder, data)):
            os.remove(os.path.join(folder, data))  # the replaced file's, which no longer has any
        os.replace(os.path.join(temp, base), path)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return path


def _buffer_initializers(names, buffers):
    """The initializer names that are module buffers (by their qualified name, as the exporters
    name initializers), as the JSON array BUFFERS_KEY holds."""
    import json

    return json.dumps(sorted(n for n in names if n in buffers))


def _write(model, path, data, buffers=()):
    """The graph at `path` with every initializer in the file `data` beside it; `buffers` (the
    module's buffer names) marked in its metadata."""
    if isinstance(model, bytes):
        import onnx

        proto = onnx.load_from_string(model)
        if buffers:
            entry = proto.metadata_props.add()
            entry.key = BUFFERS_KEY
            entry.value = _buffer_initializers([t.name for t in proto.graph.initializer], buffers)
        onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=_INLINE_BYTES)
        return
    import onnx_ir

    if buffers:
        model.metadata_props[BUFFERS_KEY] = _buffer_initializers(model.graph.initializers.keys(),
                                                                 buffers)
    onnx_ir.save(model, path, external_data=data, size_threshold_bytes=_INLINE_BYTES)


def _outputs(module, args, kwargs):
    """The module's outputs on the example (in eval mode, modes put back), flattened."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            out = module(*args, **kwargs)
    finally:
        for m, mode in modes:
            m.training = mode
    leaves = torch.utils._pytree.tree_leaves(out)
    return [t.detach().cpu() for t in leaves if isinstance(t, torch.Tensor)]


def _check(path, module, args, kwargs, expected):
    """None when lopper's executor computes `expected` from the file at `path`, else why not."""
    try:
        session = _lopper.InferenceSession(path)
        names = [i.name for i in session.get_inputs()]
        feeds = [t.detach().cpu().contiguous()
                 for t in _prune._example_tensors(module, args, kwargs)]
        if len(names) != len(feeds):
            return (f"the file has {len(names)} inputs, the example {len(feeds)} tensors")
        got = session.run(None, dict(zip(names, feeds)))
    except RuntimeError as e:
        return f"lopper cannot run the export: {str(e).splitlines()[0] if str(e) else e}"
    got = [torch.as_tensor(g) for g in got]
    if not _prune._same_outputs(got, expected):
        return "lopper's executor computes other outputs from the export than the module"
    return None
