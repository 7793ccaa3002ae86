"""A module's ONNX graph from its torch.fx trace: milliseconds where torch.onnx.export takes seconds.

torch.onnx.export(dynamo=True) traces the module with torch.export, decomposes it into core ATen
and translates every op through onnxscript: 3-8 s for a torchvision CNN, most of what a
lopper.prune_structured call on it costs. A module that torch.fx.symbolic_trace traces and that is
built from standard layers (convolutions, BatchNorm, Linear, LayerNorm, pools, activations, adds,
products, concatenations, flattens) is written here directly, one ONNX node per layer, with every
parameter and buffer an initializer under its own name, as the exporter names them. Anything else
(an op not in the table below, a trace that fails, keyword inputs, a dtype numpy cannot hold) gives
None and the caller exports with torch.onnx.export as before.

The graph is checked before it is used: lopper's executor runs it on the example inputs and must
give the module's own outputs (_prune._export); a graph that does not is not used either.
"""
import operator

import torch
import torch.nn.functional as F

# The opset torch.onnx.export writes (lopper reads both alike).
_OPSET = 20

_ACTIVATIONS = {
    torch.nn.ReLU: "Relu", torch.nn.Sigmoid: "Sigmoid", torch.nn.Tanh: "Tanh",
    torch.nn.Hardswish: "HardSwish",
}
_FUNCTIONS = {
    F.relu: "Relu", torch.relu: "Relu", torch.sigmoid: "Sigmoid", F.sigmoid: "Sigmoid",
    torch.tanh: "Tanh", F.tanh: "Tanh", F.hardswish: "HardSwish",
}
_METHODS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}
_BINARY = {operator.add: "Add", torch.add: "Add", operator.mul: "Mul", torch.mul: "Mul",
           operator.sub: "Sub", torch.sub: "Sub", operator.truediv: "Div", torch.div: "Div"}
_BINARY_METHODS = {"add": "Add", "mul": "Mul", "sub": "Sub", "div": "Div"}
_IDENTITY_MODULES = (torch.nn.Identity, torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d,
                     torch.nn.Dropout3d, torch.nn.AlphaDropout)


class _Unsupported(Exception):
    pass


def onnx_of(module, args, kwargs, external=None):
    """(ONNX bytes, the module's outputs on ``args``) for a module in eval mode that torch.fx
    traces into layers of the table above; None otherwise. With ``external`` (a list), the
    initializers are left out of the bytes and appended to it as (name, tensor) instead, for a
    caller that hands them to lopper as tensors (the parameters themselves, not copied here)."""
    if kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args):
        return None
    try:
        traced = torch.fx.symbolic_trace(module)
    except Exception:
        return None
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        return None
    from torch.fx.passes.shape_prop import ShapeProp
    try:
        with torch.no_grad():
            outputs = ShapeProp(traced).propagate(*args)
    except Exception:
        return None
    try:
        exported = _Writer(traced, args).model(external)
    except _Unsupported:
        return None
    flat = [x for x in torch.utils._pytree.tree_leaves(outputs) if isinstance(x, torch.Tensor)]
    return exported, flat


class _Writer:
    """The ONNX model of a traced module: one pass over its fx nodes."""

    def __init__(self, traced, args):
        import onnx
        from onnx import helper
        self.onnx, self.helper = onnx, helper
        self.traced = traced
        self.modules = dict(traced.named_modules())
        self.args = args
        self.nodes, self.initializers, self.seen = [], [], set()
        self.names = {}  # fx node -> the ONNX value it computes
        self.count = 0

    def model(self, external=None):
        h = self.helper
        inputs, outputs = [], []
        arg_i = 0
        for n in self.traced.graph.nodes:
            if n.op == "placeholder":
                x = self.args[arg_i]
                arg_i += 1
                # The forward's own argument name (fx renames one that shadows a builtin, such
                # as `input`): data is routed to the graph's inputs by it.
                name = str(n.target).lstrip("*")
                inputs.append(self._value_info(name, x.dtype, ["batch"] + list(x.shape[1:])
                                               if x.dim() else []))
                self.names[n] = name
            elif n.op == "get_attr":
                self.names[n] = self._parameter(n.target)
            elif n.op == "call_module":
                self.names[n] = self._module(n, self.modules[n.target])
            elif n.op == "call_function":
                self.names[n] = self._function(n)
            elif n.op == "call_method":
                self.names[n] = self._method(n)
            elif n.op == "output":
                results = n.args[0]
                if isinstance(results, torch.fx.Node):
                    results = (results,)
                if not isinstance(results, (tuple, list)) or not results:
                    raise _Unsupported("output")
                for r in results:
                    if not isinstance(r, torch.fx.Node) or "tensor_meta" not in r.meta:
                        raise _Unsupported("output")
                    name = self.names[r]
                    if name in {o.name for o in outputs} or name in self.seen or any(
                            i.name == name for i in inputs):
                        # An output that is an input or a parameter, or twice: through Identity.
                        name = self._node("Identity", [name], n.name + f"_{len(outputs)}")
                    meta = r.meta["tensor_meta"]
                    outputs.append(self._value_info(name, meta.dtype, None))
        graph = h.make_graph(self.nodes, "module", inputs, outputs)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", _OPSET)],
                             producer_name="lopper (torch.fx)")
        model.ir_version = 10  # what torch.onnx.export writes, and every runtime reads
        # NOTE: the initializers are appended to the serialized graph as protobuf fields (a
        # repeated field may come anywhere in a message), each tensor's bytes copied once: through
        # TensorProto objects, a module's weights would be copied four times (a third of a
        # resnet18 prune's time).
        if external is not None:
            external.extend(self.initializers)
            return model.SerializeToString()
        head = model.graph.SerializeToString()
        model.ClearField("graph")
        parts = [head]
        for name, t in self.initializers:
            proto = self.onnx.TensorProto()
            proto.name = name
            proto.data_type = getattr(self.onnx.TensorProto, _ELEM[t.dtype])
            proto.dims.extend(t.shape)
            header = proto.SerializeToString()
            data = memoryview(t.numpy()).cast("B") if t.numel() else b""
            body_len = len(header) + 1 + len(_varint(len(data))) + len(data)
            parts += [_GRAPH_INITIALIZER, _varint(body_len), header, _TENSOR_RAW_DATA,
                      _varint(len(data)), data]
        graph_len = sum(len(x) for x in parts)
        return b"".join([model.SerializeToString(), _MODEL_GRAPH, _varint(graph_len)] + parts)

    # --- values ---------------------------------------------------------------------------

    def _value_info(self, name, dtype, shape):
        elem = _ELEM.get(dtype)
        if elem is None:
            raise _Unsupported(str(dtype))
        return self.helper.make_tensor_value_info(name, getattr(self.onnx.TensorProto, elem), shape)

    def _parameter(self, qualified):
        if qualified not in self.seen:
            t = self.traced.get_parameter(qualified) if _is_parameter(self.traced, qualified) \
                else self.traced.get_buffer(qualified)
            self._initializer(qualified, t)
        return qualified

    def _initializer(self, name, t):
        if t.dtype not in _ELEM or t.is_complex():
            raise _Unsupported(str(t.dtype))
        self.initializers.append((name, t.detach().cpu().contiguous()))
        self.seen.add(name)

    def _constant(self, values, dtype):
        self.count += 1
        name = f"_const_{self.count}"
        self._initializer(name, torch.tensor(values, dtype=dtype))
        return name

    def _node(self, op, inputs, name, **attrs):
        self.nodes.append(self.helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def _in(self, a):
        if not isinstance(a, torch.fx.Node):
            raise _Unsupported("a non-tensor argument")
        return self.names[a]

    def _meta(self, n):
        meta = n.meta.get("tensor_meta")
        if meta is None or not hasattr(meta, "shape"):
            raise _Unsupported("no tensor")
        return meta

    # --- layers ---------------------------------------------------------------------------

    def _module(self, n, m):
        if len(n.args) != 1 or n.kwargs:
            raise _Unsupported("a layer called with more than its input")
        x = self._in(n.args[0])
        p = lambda attr: self._parameter(f"{n.target}.{attr}")  # noqa: E731
        name = n.name
        if isinstance(m, _IDENTITY_MODULES):
            return x
        if type(m) in _ACTIVATIONS:
            return self._node(_ACTIVATIONS[type(m)], [x], name)
        if isinstance(m, torch.nn.ReLU6):
            return self._clip(x, 0.0, 6.0, n)
        if isinstance(m, torch.nn.Hardtanh):
            return self._clip(x, m.min_val, m.max_val, n)
        if isinstance(m, torch.nn.Hardsigmoid):
            return self._node("HardSigmoid", [x], name, alpha=1.0 / 6, beta=0.5)
        if isinstance(m, torch.nn.SiLU):
            return self._silu(x, name)
        if isinstance(m, torch.nn.GELU):
            return self._node("Gelu", [x], name, approximate=m.approximate)
        if isinstance(m, torch.nn.LeakyReLU):
            return self._node("LeakyRelu", [x], name, alpha=float(m.negative_slope))
        if isinstance(m, torch.nn.Softmax):
            if m.dim is None:
                raise _Unsupported("Softmax without dim")
            return self._node("Softmax", [x], name, axis=int(m.dim))
        if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
            return self._conv(n, m, x, p)
        if isinstance(m, (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d,
                          torch.nn.ConvTranspose3d)):
            if m.padding_mode != "zeros":
                raise _Unsupported("padding mode")
            ins = [x, p("weight")] + ([p("bias")] if m.bias is not None else [])
            return self._node("ConvTranspose", ins, name, kernel_shape=list(m.kernel_size),
                              strides=list(m.stride), dilations=list(m.dilation),
                              pads=list(m.padding) * 2, group=int(m.groups),
                              output_padding=list(m.output_padding))
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            if not m.affine or m.running_mean is None or m.training:
                raise _Unsupported("BatchNorm without statistics or scale")
            ins = [x, p("weight"), p("bias"), p("running_mean"), p("running_var")]
            return self._node("BatchNormalization", ins, name, epsilon=float(m.eps),
                              momentum=1.0 - float(m.momentum or 0.1))
        if isinstance(m, torch.nn.Linear):
            return self._linear(n, x, p("weight"), p("bias") if m.bias is not None else None)
        if isinstance(m, torch.nn.LayerNorm):
            if len(m.normalized_shape) != 1:
                raise _Unsupported("LayerNorm over several dims")
            ins = [x] + ([p("weight")] if m.weight is not None else
                         [self._constant([1.0] * m.normalized_shape[0], self._meta(n).dtype)])
            if m.bias is not None:
                ins.append(p("bias"))
            return self._node("LayerNormalization", ins, name, axis=-1, epsilon=float(m.eps))
        if isinstance(m, torch.nn.MaxPool2d):
            if m.return_indices:
                raise _Unsupported("MaxPool indices")
            return self._node("MaxPool", [x], name, kernel_shape=_pair(m.kernel_size),
                              strides=_pair(m.stride or m.kernel_size), pads=_pair(m.padding) * 2,
                              dilations=_pair(m.dilation), ceil_mode=int(m.ceil_mode))
        if isinstance(m, torch.nn.AvgPool2d):
            if m.divisor_override is not None:
                raise _Unsupported("AvgPool divisor")
            return self._node("AveragePool", [x], name, kernel_shape=_pair(m.kernel_size),
                              strides=_pair(m.stride or m.kernel_size), pads=_pair(m.padding) * 2,
                              ceil_mode=int(m.ceil_mode),
                              count_include_pad=int(m.count_include_pad))
        if isinstance(m, (torch.nn.AdaptiveAvgPool2d, torch.nn.AdaptiveAvgPool1d)):
            return self._global_pool(x, m.output_size, name)
        if isinstance(m, torch.nn.Flatten):
            return self._flatten(n, x, m.start_dim, m.end_dim)
        raise _Unsupported(type(m).__name__)

    def _conv(self, n, m, x, p):
        if m.padding_mode != "zeros":
            raise _Unsupported("padding mode")
        k = list(m.kernel_size)
        if m.padding == "valid":
            pads = [0] * (2 * len(k))
        elif m.padding == "same":
            total = [d * (s - 1) for d, s in zip(m.dilation, k)]
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            pads = list(m.padding) * 2
        ins = [x, p("weight")] + ([p("bias")] if m.bias is not None else [])
        return self._node("Conv", ins, n.name, kernel_shape=k, strides=list(m.stride),
                          dilations=list(m.dilation), pads=pads, group=int(m.groups))

    def _linear(self, n, x, weight, bias):
        rank = len(self._meta(n.args[0]).shape)
        if rank == 2:
            ins = [x, weight] + ([bias] if bias else [])
            return self._node("Gemm", ins, n.name, transB=1)
        wt = self._node("Transpose", [weight], n.name + "_weight_t", perm=[1, 0])
        y = self._node("MatMul", [x, wt], n.name + ("_matmul" if bias else ""))
        return self._node("Add", [y, bias], n.name) if bias else y

    def _clip(self, x, lo, hi, n):
        dtype = self._meta(n).dtype
        return self._node("Clip", [x, self._constant(float(lo), dtype),
                                   self._constant(float(hi), dtype)], n.name)

    def _silu(self, x, name):
        s = self._node("Sigmoid", [x], name + "_sigmoid")
        return self._node("Mul", [x, s], name)

    def _global_pool(self, x, size, name):
        if size not in (1, (1,), (1, 1), [1, 1]):
            raise _Unsupported("adaptive pool to a size other than 1")
        return self._node("GlobalAveragePool", [x], name)

    def _flatten(self, n, x, start, end):
        rank = len(self._meta(n.args[0]).shape)
        if start != 1 or end not in (-1, rank - 1):
            raise _Unsupported("flatten other than from dim 1 to the last")
        return self._node("Flatten", [x], n.name, axis=1)

    # --- functions and methods -------------------------------------------------------------

    def _function(self, n):
        f = n.target
        a, kw = n.args, dict(n.kwargs)
        if f in _FUNCTIONS:
            kw.pop("inplace", None)
            if len(a) != 1 or kw:
                raise _Unsupported(str(f))
            return self._node(_FUNCTIONS[f], [self._in(a[0])], n.name)
        if f in _BINARY:
            return self._binary(n, _BINARY[f], a, kw)
        if f is F.relu6:
            return self._clip(self._in(a[0]), 0.0, 6.0, n)
        if f is F.hardsigmoid:
            return self._node("HardSigmoid", [self._in(a[0])], n.name, alpha=1.0 / 6, beta=0.5)
        if f is F.silu:
            return self._silu(self._in(a[0]), n.name)
        if f is F.gelu:
            return self._node("Gelu", [self._in(a[0])], n.name,
                              approximate=kw.get("approximate", "none"))
        if f is torch.cat or f is torch.concat:
            tensors = a[0] if a else kw.pop("tensors")
            dim = a[1] if len(a) > 1 else kw.get("dim", 0)
            if not isinstance(tensors, (list, tuple)) or not isinstance(dim, int):
                raise _Unsupported("cat")
            return self._node("Concat", [self._in(t) for t in tensors], n.name, axis=dim)
        if f is torch.flatten:
            start = a[1] if len(a) > 1 else kw.get("start_dim", 0)
            end = a[2] if len(a) > 2 else kw.get("end_dim", -1)
            return self._flatten(n, self._in(a[0]), start, end)
        if f is F.adaptive_avg_pool2d or f is F.adaptive_avg_pool1d:
            return self._global_pool(self._in(a[0]), a[1] if len(a) > 1 else kw["output_size"],
                                     n.name)
        if f is F.dropout or getattr(f, "__name__", "") == "stochastic_depth":
            # dropout(input, p, training=True, inplace), stochastic_depth(input, p, mode,
            # training=True): the identity when not training.
            at = 2 if f is F.dropout else 3
            training = a[at] if len(a) > at else kw.get("training", True)
            if training is not False:
                raise _Unsupported("dropout in training")
            return self._in(a[0])
        raise _Unsupported(getattr(f, "__name__", str(f)))

    def _method(self, n):
        m, a, kw = n.target, n.args, dict(n.kwargs)
        if m in _METHODS and len(a) == 1 and not kw:
            return self._node(_METHODS[m], [self._in(a[0])], n.name)
        if m in _BINARY_METHODS:
            return self._binary(n, _BINARY_METHODS[m], a, kw)
        if m == "contiguous":
            return self._in(a[0])
        if m == "flatten":
            start = a[1] if len(a) > 1 else kw.get("start_dim", 0)
            end = a[2] if len(a) > 2 else kw.get("end_dim", -1)
            return self._flatten(n, self._in(a[0]), start, end)
        if m == "mean":
            dims = a[1] if len(a) > 1 else kw.get("dim")
            keep = a[2] if len(a) > 2 else kw.get("keepdim", False)
            if dims is None or not isinstance(keep, bool):
                raise _Unsupported("mean")
            dims = [dims] if isinstance(dims, int) else list(dims)
            axes = self._constant(dims, torch.int64)
            return self._node("ReduceMean", [self._in(a[0]), axes], n.name, keepdims=int(keep))
        raise _Unsupported(f"Tensor.{m}")

    def _binary(self, n, op, a, kw):
        if kw or len(a) != 2:
            raise _Unsupported(op)
        dtype = self._meta(n).dtype
        ins = []
        for v in a:
            if isinstance(v, torch.fx.Node):
                ins.append(self._in(v))
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                ins.append(self._constant(float(v), dtype))
            else:
                raise _Unsupported(op)
        return self._node(op, ins, n.name)


def _varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# Protobuf keys (field number << 3 | 2, length-delimited): ModelProto.graph = 7,
# GraphProto.initializer = 5, TensorProto.raw_data = 9.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = b"\x3a", b"\x2a", b"\x4a"


def _pair(v):
    return list(v) if isinstance(v, (tuple, list)) else [v, v]


def _is_parameter(module, qualified):
    try:
        module.get_parameter(qualified)
        return True
    except AttributeError:
        return False


_ELEM = {torch.float32: "FLOAT", torch.float64: "DOUBLE", torch.float16: "FLOAT16",
         torch.int64: "INT64", torch.int32: "INT32", torch.bool: "BOOL", torch.uint8: "UINT8",
         torch.int8: "INT8"}
