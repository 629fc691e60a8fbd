"""The ATen table: every core-ATen op Kiln takes, and the Kiln ops it becomes.

Note [The ATen table]
One entry per ATen overload ("aten.add.Tensor"), declared with ``@aten(name, emits, note)``
over its converter. ``emits`` lists every Kiln op the converter may append: the lowering checks
each emission against it (an undeclared op is an internal error), and the build copies the
lists into ``OpDef::aten_ops`` (python/tools/gen_aten_ops.py), so that ``kiln ops --json``
reports each op's "aten" capability from this table and nowhere else. An op missing here runs
in torch: the graph is partitioned around it (kiln/lowering.py).

A converter receives a context ``cx`` (kiln/lowering.py: ``ConvertContext``) and the FX node's
arguments with every tensor replaced by a Kiln value (``.dtype`` a Kiln short name, ``.shape`` a
tuple). It returns a value, a tuple of values for multi-output ops (``None`` where Kiln does
not compute an output: a getitem reading it falls back), or raises ``Unsupported(reason)`` for
arguments Kiln cannot take — the reason is what ``kiln.explain`` prints.

This file imports only the standard library: the build runs it with plain python3.
"""

ATEN_TABLE = {}  # "aten.add.Tensor" -> Entry


class Unsupported(Exception):
    """The node's arguments are outside what Kiln's ops take; the message says why."""


class Entry:
    __slots__ = ("name", "emits", "note", "convert")

    def __init__(self, name, emits, note, convert):
        self.name, self.emits, self.note, self.convert = name, tuple(emits), note, convert


def aten(name, emits, note=""):
    def register(fn):
        assert name not in ATEN_TABLE, f"duplicate ATen entry {name}"
        ATEN_TABLE[name] = Entry(name, emits, note, fn)
        return fn

    return register


def _dims(dims, rank):
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return [d % rank if rank else 0 for d in dims]


def _pair(v):
    """An int or a 1- or 2-element list as a 2-element list (pooling arguments)."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 2 if len(v) == 1 else v


def _is_float(dtype):
    return dtype in ("f32", "f16", "bf16", "f64")


# ---- pointwise ---------------------------------------------------------------------------------
_UNARY = {
    "abs": "abs", "neg": "neg", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "reciprocal": "reciprocal", "sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu",
    "silu": "silu", "erf": "erf", "sin": "sin", "cos": "cos", "floor": "floor", "ceil": "ceil",
    "sign": "sign",
}


def _unary(kiln_op):
    def convert(cx, x):
        return cx.op(kiln_op, [cx.cast(x, cx.out_dtype)])

    return convert


for _a, _k in _UNARY.items():
    aten(f"aten.{_a}.default", [_k, "cast"])(_unary(_k))


@aten("aten.round.default", ["round"], "round half to even, like torch")
def _round(cx, x):
    return cx.op("round", [x])


@aten("aten.gelu.default", ["gelu"])
def _gelu(cx, x, approximate="none"):
    return cx.op("gelu", [x], approximate=approximate)


@aten("aten.clamp.default", ["clamp", "cast"], "scalar bounds")
def _clamp(cx, x, min=None, max=None):
    x = cx.cast(x, cx.out_dtype)
    return cx.op("clamp", [x], min=None if min is None else float(min),
                 max=None if max is None else float(max))


@aten("aten.hardtanh.default", ["clamp"])
def _hardtanh(cx, x, min_val=-1.0, max_val=1.0):
    return cx.op("clamp", [x], min=float(min_val), max=float(max_val))


@aten("aten.leaky_relu.default", ["where", "gt", "mul"], "where(x > 0, x, slope * x)")
def _leaky_relu(cx, x, negative_slope=0.01):
    zero = cx.scalar(0, x.dtype)
    return cx.op("where", [cx.op("gt", [x, zero]), x, cx.op("mul", [x, cx.scalar(negative_slope, x.dtype)])])


@aten("aten.logical_not.default", ["not"], "true where x == 0")
def _logical_not(cx, x):
    return cx.op("not", [x])


@aten("aten.bitwise_not.default", ["not"], "bool inputs only")
def _bitwise_not(cx, x):
    if x.dtype != "bool":
        raise Unsupported(f"bitwise_not of {x.dtype}: Kiln has logical not only")
    return cx.op("not", [x])


@aten("aten._to_copy.default", ["cast", "copy"], "dtype conversion on one device")
def _to_copy(cx, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and not cx.same_device(device):
        raise Unsupported(f"moves a tensor to {device}: device copies run in torch")
    if cx.out_dtype != x.dtype:
        return cx.op("cast", [x], dtype=cx.dtype_attr(cx.out_dtype))
    return cx.op("copy", [x])


@aten("aten.clone.default", ["copy"], "a fresh copy (never an alias of the input)")
def _clone(cx, x, memory_format=None):
    return cx.op("copy", [x])


@aten("aten.lift_fresh_copy.default", ["copy"])
def _lift_fresh_copy(cx, x):
    return cx.op("copy", [x])


@aten("aten.alias.default", [], "the input itself")
def _alias(cx, x):
    return x


@aten("aten.detach.default", [], "the input itself (inference)")
def _detach(cx, x):
    return x


# Binary ops: arithmetic computes in the output dtype (torch's type promotion, from the node's
# metadata); Python scalars become 0-d constants of that dtype.
def _binary(kiln_op):
    def convert(cx, a, b, alpha=1):
        dt = cx.out_dtype
        a, b = cx.operand(a, dt), cx.operand(b, dt)
        if alpha != 1:
            b = cx.op("mul", [b, cx.scalar(alpha, dt)])
        return cx.op(kiln_op, [a, b])

    return convert


for _a, _k in {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}.items():
    for _ov in ("Tensor", "Scalar"):
        aten(f"aten.{_a}.{_ov}", [_k, "cast"] + (["mul"] if _a in ("add", "sub") else []))(_binary(_k))


@aten("aten.rsub.Scalar", ["sub", "mul", "cast"], "b - alpha * a")
def _rsub(cx, a, b, alpha=1):
    dt = cx.out_dtype
    a, b = cx.operand(a, dt), cx.operand(b, dt)
    if alpha != 1:
        a = cx.op("mul", [a, cx.scalar(alpha, dt)])
    return cx.op("sub", [b, a])


@aten("aten.div.Tensor_mode", ["div", "floor", "cast"], "rounding_mode None or 'floor' on floats")
def _div_mode(cx, a, b, rounding_mode=None):
    dt = cx.out_dtype
    if rounding_mode is not None and (rounding_mode != "floor" or not _is_float(dt)):
        raise Unsupported(f"div with rounding_mode={rounding_mode!r} on {dt}")
    q = cx.op("div", [cx.operand(a, dt), cx.operand(b, dt)])
    return q if rounding_mode is None else cx.op("floor", [q])


for _a in ("maximum", "minimum"):
    aten(f"aten.{_a}.default", [_a, "cast"])(_binary(_a))


@aten("aten.pow.Tensor_Scalar", ["pow", "mul", "cast"], "x**2 as x*x")
def _pow_scalar(cx, x, exponent):
    dt = cx.out_dtype
    x = cx.cast(x, dt)
    if exponent == 2:
        return cx.op("mul", [x, x])
    return cx.op("pow", [x, cx.scalar(exponent, dt)])


aten("aten.pow.Tensor_Tensor", ["pow", "cast"])(_binary("pow"))


def _compare(kiln_op):
    def convert(cx, a, b):
        dt = cx.result_type(a, b)
        return cx.op(kiln_op, [cx.operand(a, dt), cx.operand(b, dt)])

    return convert


for _a in ("eq", "ne", "lt", "le", "gt", "ge"):
    for _ov in ("Tensor", "Scalar"):
        aten(f"aten.{_a}.{_ov}", [_a, "cast"])(_compare(_a))


def _logical(kiln_op, bool_only):
    def convert(cx, a, b):
        if bool_only and (a.dtype != "bool" or b.dtype != "bool"):
            raise Unsupported(f"bitwise op on {a.dtype}/{b.dtype}: Kiln has logical and/or only")
        return cx.op(kiln_op, [a, b])

    return convert


aten("aten.logical_and.default", ["and"])(_logical("and", False))
aten("aten.logical_or.default", ["or"])(_logical("or", False))
aten("aten.bitwise_and.Tensor", ["and"], "bool inputs only")(_logical("and", True))
aten("aten.bitwise_or.Tensor", ["or"], "bool inputs only")(_logical("or", True))


@aten("aten.where.self", ["where", "cast"])
def _where(cx, cond, a, b):
    dt = cx.out_dtype
    return cx.op("where", [cond, cx.operand(a, dt), cx.operand(b, dt)])


# ---- reductions --------------------------------------------------------------------------------
def _reduce(kiln_op):
    def convert(cx, x, dim=None, keepdim=False, dtype=None):
        x = cx.cast(x, cx.out_dtype) if dtype is not None or kiln_op == "mean" else x
        out = cx.op(kiln_op, [x], dims=_dims(dim, len(x.shape)), keepdim=bool(keepdim))
        return cx.cast(out, cx.out_dtype)

    return convert


aten("aten.sum.dim_IntList", ["sum", "cast"])(_reduce("sum"))
aten("aten.mean.dim", ["mean", "cast"])(_reduce("mean"))


@aten("aten.sum.default", ["sum", "cast"])
def _sum_all(cx, x, dtype=None):
    return _reduce("sum")(cx, x, None, False, dtype)


@aten("aten.mean.default", ["mean", "cast"])
def _mean_all(cx, x, dtype=None):
    return _reduce("mean")(cx, x, None, False, dtype)


@aten("aten.amax.default", ["max"])
def _amax(cx, x, dim=(), keepdim=False):
    return cx.op("max", [x], dims=_dims(list(dim) or None, len(x.shape)), keepdim=bool(keepdim))


@aten("aten.amin.default", ["min"])
def _amin(cx, x, dim=(), keepdim=False):
    return cx.op("min", [x], dims=_dims(list(dim) or None, len(x.shape)), keepdim=bool(keepdim))


@aten("aten.max.dim", ["max", "argmax"], "(values, indices)")
def _max_dim(cx, x, dim, keepdim=False):
    d = _dims(dim, len(x.shape))
    return (cx.op("max", [x], dims=d, keepdim=bool(keepdim)),
            cx.op("argmax", [x], dim=d[0], keepdim=bool(keepdim)))


@aten("aten.min.dim", ["min", "argmin"], "(values, indices)")
def _min_dim(cx, x, dim, keepdim=False):
    d = _dims(dim, len(x.shape))
    return (cx.op("min", [x], dims=d, keepdim=bool(keepdim)),
            cx.op("argmin", [x], dim=d[0], keepdim=bool(keepdim)))


def _arg(kiln_op):
    def convert(cx, x, dim=None, keepdim=False):
        if dim is None:
            x = cx.op("reshape", [x], shape=[-1])
            dim = 0
        return cx.op(kiln_op, [x], dim=dim % max(len(x.shape), 1), keepdim=bool(keepdim))

    return convert


aten("aten.argmax.default", ["argmax", "reshape"])(_arg("argmax"))
aten("aten.argmin.default", ["argmin", "reshape"])(_arg("argmin"))


@aten("aten.prod.dim_int", ["prod", "cast"])
def _prod(cx, x, dim, keepdim=False, dtype=None):
    return _reduce("prod")(cx, x, dim, keepdim, dtype)


@aten("aten.var.correction", ["var", "cast"])
def _var(cx, x, dim=None, correction=None, keepdim=False):
    c = 1 if correction is None else correction
    if int(c) != c:
        raise Unsupported(f"var with a fractional correction {c}")
    return cx.op("var", [x], dims=_dims(dim, len(x.shape)), correction=int(c), keepdim=bool(keepdim))


# any/all reduce (x != 0) as float32 0/1 and compare the result with 0: the CPU compiler fuses
# that into one loop-kernel reduction (a max/min over bool runs as an eager kernel). This form
# once hid a CPU-compiler bug that BERT's attention mask (_safe_softmax) exposed: the SIMD
# softmax turned a row with a lone -inf into NaN (fixed; tests/e2e/inductor_masked_softmax_test.cc
# and softmax's "-inf entries" op sample hold it).
def _any_all(kiln_op):
    def convert(cx, x, dim=None, keepdim=False):
        f = cx.cast(x if x.dtype == "bool" else cx.op("ne", [x, cx.scalar(0, x.dtype)]), "f32")
        r = cx.op(kiln_op, [f], dims=_dims(dim, len(x.shape)), keepdim=bool(keepdim))
        return cx.op("ne", [r, cx.scalar(0, "f32")])

    return convert


for _a, _k in (("any.dim", "max"), ("any.dims", "max"), ("any.default", "max"),
               ("all.dim", "min"), ("all.default", "min")):
    aten(f"aten.{_a}", [_k, "ne", "cast"], f"{_k} of (x != 0) as float32")(_any_all(_k))


# ---- normalization -----------------------------------------------------------------------------
@aten("aten._softmax.default", ["softmax", "cast"])
def _softmax(cx, x, dim, half_to_float=False):
    return cx.cast(cx.op("softmax", [x], dim=dim % len(x.shape)), cx.out_dtype)


@aten("aten._log_softmax.default", ["log_softmax", "cast"])
def _log_softmax(cx, x, dim, half_to_float=False):
    return cx.cast(cx.op("log_softmax", [x], dim=dim % len(x.shape)), cx.out_dtype)


@aten("aten.native_layer_norm.default", ["layer_norm"], "(out, -, -): mean and rstd not computed")
def _layer_norm(cx, x, normalized_shape, weight, bias, eps):
    return (cx.op("layer_norm", [x, weight, bias], normalized_shape=list(normalized_shape),
                  eps=float(eps)), None, None)


@aten("aten._native_batch_norm_legit_no_training.default", ["batch_norm"],
      "inference batch norm (running statistics); (out, -, -)")
def _batch_norm(cx, x, weight, bias, running_mean, running_var, momentum, eps):
    return (cx.op("batch_norm", [x, running_mean, running_var, weight, bias], eps=float(eps)),
            None, None)


@aten("aten.native_group_norm.default", ["group_norm"], "(out, -, -)")
def _group_norm(cx, x, weight, bias, n, c, hxw, group, eps):
    return (cx.op("group_norm", [x, weight, bias], num_groups=int(group), eps=float(eps)), None, None)


# ---- linear algebra ----------------------------------------------------------------------------
@aten("aten.mm.default", ["matmul"])
def _mm(cx, a, b):
    return cx.op("matmul", [a, b])


# ---- attention: the fused kernels torch's scaled_dot_product_attention dispatches to on CUDA ----
# (on the CPU it decomposes into matmul/softmax before Kiln sees it). Output 0 is the attention;
# the others (log-sum-exp, RNG state, debug masks) exist for autograd and dropout, which Kiln's
# inference graphs never read: only output 0 is computed (lowering.plan checks getitem).
def _sdpa(cx, q, k, v, bias, dropout_p, is_causal, scale, n_outputs):
    if dropout_p:
        raise Unsupported(f"attention with dropout_p={dropout_p} (inference graphs have none)")
    attrs = {"is_causal": bool(is_causal)}
    if scale is not None:
        attrs["scale"] = float(scale)
    out = cx.op("scaled_dot_product_attention", [q, k, v, bias], **attrs)
    return (out,) + (None,) * (n_outputs - 1)


@aten("aten._scaled_dot_product_efficient_attention.default", ["scaled_dot_product_attention"],
      "output 0; no dropout")
def _sdpa_efficient(cx, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                    scale=None):
    return _sdpa(cx, q, k, v, attn_bias, dropout_p, is_causal, scale, 4)


@aten("aten._scaled_dot_product_flash_attention.default", ["scaled_dot_product_attention"],
      "output 0; no dropout")
def _sdpa_flash(cx, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, scale=None):
    return _sdpa(cx, q, k, v, None, dropout_p, is_causal, scale, 9)


@aten("aten._scaled_dot_product_cudnn_attention.default", ["scaled_dot_product_attention"],
      "output 0; no dropout")
def _sdpa_cudnn(cx, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                return_debug_mask=False, scale=None):
    return _sdpa(cx, q, k, v, attn_bias, dropout_p, is_causal, scale, 9)


@aten("aten.bmm.default", ["matmul"])
def _bmm(cx, a, b):
    return cx.op("matmul", [a, b])


@aten("aten.addmm.default", ["linear", "matmul", "add", "mul"],
      "bias + a @ b; linear(a, w, bias) when b is w transposed")
def _addmm(cx, bias, a, b, beta=1, alpha=1):
    w = cx.transposed_source(b)  # b = w.t() for a 2-d w: Kiln's linear computes a @ w^T
    if w is not None and beta == 1 and alpha == 1 and len(bias.shape) <= 1:
        return cx.op("linear", [a, w, bias])
    y = cx.op("matmul", [a, b])
    if alpha != 1:
        y = cx.op("mul", [y, cx.scalar(alpha, y.dtype)])
    if beta != 1:
        bias = cx.op("mul", [bias, cx.scalar(beta, bias.dtype)])
    return cx.op("add", [y, bias]) if beta != 0 else y


# ---- convolution and pooling -------------------------------------------------------------------
@aten("aten.convolution.default", ["conv2d", "conv_transpose2d", "unsqueeze", "squeeze"],
      "2-d convolutions; 1-d ones through an inserted size-1 dim")
def _convolution(cx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    rank = len(w.shape)
    one_d = rank == 3
    if rank not in (3, 4):
        raise Unsupported(f"{rank - 2}-d convolution: Kiln has 2-d (and 1-d through 2-d) ones")
    stride, padding, dilation = list(stride), list(padding), list(dilation)
    output_padding = list(output_padding)
    if one_d:
        x = cx.op("unsqueeze", [x], dims=[2])
        w = cx.op("unsqueeze", [w], dims=[2])
        stride, padding, dilation = [1] + stride, [0] + padding, [1] + dilation
        output_padding = [0] + output_padding
    if transposed:
        y = cx.op("conv_transpose2d", [x, w, b], stride=stride, padding=padding,
                  output_padding=output_padding, dilation=dilation, groups=int(groups))
    else:
        if any(output_padding):
            raise Unsupported("output_padding on a forward convolution")
        y = cx.op("conv2d", [x, w, b], stride=stride, padding=padding, dilation=dilation,
                  groups=int(groups))
    return cx.op("squeeze", [y], dims=[2]) if one_d else y


@aten("aten.max_pool2d_with_indices.default", ["max_pool2d"], "(values, -): no indices")
def _max_pool2d(cx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    stride = _pair(stride) if stride else _pair(kernel_size)
    return (cx.op("max_pool2d", [x], kernel_size=_pair(kernel_size), stride=stride,
                  padding=_pair(padding), dilation=_pair(dilation), ceil_mode=bool(ceil_mode)), None)


@aten("aten.avg_pool2d.default", ["avg_pool2d"])
def _avg_pool2d(cx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    if divisor_override is not None:
        raise Unsupported("avg_pool2d with divisor_override")
    stride = _pair(stride) if stride else _pair(kernel_size)
    return cx.op("avg_pool2d", [x], kernel_size=_pair(kernel_size), stride=stride,
                 padding=_pair(padding), ceil_mode=bool(ceil_mode),
                 count_include_pad=bool(count_include_pad))


@aten("aten._adaptive_avg_pool2d.default", ["adaptive_avg_pool2d"])
def _adaptive_avg_pool2d(cx, x, output_size):
    return cx.op("adaptive_avg_pool2d", [x], output_size=list(output_size))


# ---- shape and layout --------------------------------------------------------------------------
# Ops that keep the row-major order of elements become reshape to the node's output shape.
def _reshape_to_output(cx, x, *args):
    return cx.op("reshape", [x], shape=list(cx.out_shape))


for _a in ("view.default", "_unsafe_view.default", "reshape.default", "squeeze.dim",
           "squeeze.dims", "squeeze.default", "flatten.using_ints"):
    aten(f"aten.{_a}", ["reshape"], "reshape to the output shape")(_reshape_to_output)


@aten("aten.as_strided.default", ["reshape", "permute"],
      "a contiguous input re-viewed as a (permuted) reshape; other strides stay in torch")
def _as_strided(cx, x, size, stride, storage_offset=None):
    # as_strided addresses x's storage. Kiln values have no storage, so it is taken only where
    # x is contiguous from offset 0 (its storage is its row-major elements) and (size, stride)
    # is a permutation of a row-major layout of all of them (what avgpool's keepdim view in
    # ConvNeXt is): then it is reshape + permute. Size-1 dims have any stride.
    src = getattr(x, "val", None)
    if src is None or not src.is_contiguous() or src.storage_offset() != 0:
        raise Unsupported("as_strided of a tensor that is not contiguous from offset 0")
    if storage_offset not in (None, 0):
        raise Unsupported(f"as_strided with storage_offset {storage_offset}")
    if any(_symbolic(s) for s in list(size) + list(stride)):
        raise Unsupported("as_strided with symbolic sizes")
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    numel = 1
    for n in size:
        numel *= n
    if numel != src.numel():
        raise Unsupported(f"as_strided to {numel} of {src.numel()} elements")
    dims = sorted((i for i, n in enumerate(size) if n != 1), key=lambda i: -stride[i])
    expect = 1
    for i in reversed(dims):
        if stride[i] != expect:
            raise Unsupported(f"as_strided with strides {stride} for sizes {size}: not a "
                              f"permutation of a row-major layout")
        expect *= size[i]
    if dims == sorted(dims):
        return cx.op("reshape", [x], shape=size)
    stored = cx.op("reshape", [x], shape=[size[i] for i in dims])
    perm = cx.op("permute", [stored], dims=[dims.index(i) for i in sorted(dims)])
    return cx.op("reshape", [perm], shape=size)


@aten("aten.unsqueeze.default", ["unsqueeze"])
def _unsqueeze(cx, x, dim):
    return cx.op("unsqueeze", [x], dims=[dim % (len(x.shape) + 1)])


@aten("aten.permute.default", ["permute"])
def _permute(cx, x, dims):
    return cx.op("permute", [x], dims=[d % len(x.shape) for d in dims])


@aten("aten.t.default", ["transpose"], "rank < 2: the input itself")
def _t(cx, x):
    return x if len(x.shape) < 2 else cx.op("transpose", [x], dim0=0, dim1=1)


@aten("aten.transpose.int", ["transpose"])
def _transpose(cx, x, dim0, dim1):
    r = len(x.shape)
    return cx.op("transpose", [x], dim0=dim0 % r, dim1=dim1 % r)


@aten("aten.expand.default", ["expand"])
def _expand(cx, x, size, implicit=False):
    return cx.op("expand", [x], shape=list(cx.out_shape))


def _symbolic(v):
    return isinstance(v, str)  # a Sym (kiln/lowering.py, Note [Symbolic sizes])


@aten("aten.slice.Tensor", ["slice", "pad"],
      "symbolic bounds: a crop (pad with negative pads, Note [Symbolic sizes])")
def _slice(cx, x, dim=0, start=None, end=None, step=1):
    from .lowering import Sym

    dim = dim % len(x.shape)
    size = x.shape[dim]
    start = 0 if start is None else start
    end = 2 ** 63 - 1 if end is None else end
    if not _symbolic(start) and not _symbolic(end):
        # Concrete bounds: Kiln's slice clamps them as Python does (also on a symbolic size).
        if not _symbolic(size):
            end = min(end, size)
        return cx.op("slice", [x], dim=dim, start=int(start), end=int(end), step=int(step))
    if step != 1:
        raise Unsupported("a strided slice with symbolic bounds")
    # A symbolic bound (a sequence length): torch's "to the end" is the size, negative ints
    # count from it.
    def bound(v):
        if isinstance(v, int) and v >= 2 ** 62:
            return size
        if isinstance(v, int) and v < 0:
            return Sym(f"({size}) - {-v}") if _symbolic(size) else size + v
        return v
    return cx.crop(x, dim, bound(start), bound(end))


@aten("aten.select.int", ["slice", "squeeze", "pad"], "slice + squeeze")
def _select(cx, x, dim, index):
    dim = dim % len(x.shape)
    size = x.shape[dim]
    if _symbolic(size) and index < 0:
        from .lowering import Sym

        s = cx.crop(x, dim, Sym(f"({size}) - {-index}"), Sym(f"({size}) - {-index - 1}"))
    else:
        index = index if _symbolic(size) else index % size
        s = cx.op("slice", [x], dim=dim, start=int(index), end=int(index) + 1)
    return cx.op("squeeze", [s], dims=[dim])


@aten("aten.cat.default", ["concat", "cast"])
def _cat(cx, tensors, dim=0):
    dt = cx.out_dtype
    parts = [cx.cast(t, dt) for t in tensors if t.shape != (0,)]
    return cx.op("concat", parts, dim=dim % len(cx.out_shape))


@aten("aten.split_with_sizes.default", ["split"])
def _split_with_sizes(cx, x, split_sizes, dim=0):
    return tuple(cx.ops("split", [x], sizes=list(split_sizes), dim=dim % len(x.shape)))


@aten("aten.split.Tensor", ["split"])
def _split(cx, x, split_size, dim=0):
    dim = dim % len(x.shape)
    n = x.shape[dim]
    if _symbolic(n):
        raise Unsupported(f"split of the symbolic size {n} (the number of pieces depends on it)")
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    return tuple(cx.ops("split", [x], sizes=sizes, dim=dim))


@aten("aten.constant_pad_nd.default", ["pad"])
def _constant_pad_nd(cx, x, pad, value=0):
    n = len(pad) // 2
    begins = [pad[2 * (n - 1 - k)] for k in range(n)]
    ends = [pad[2 * (n - 1 - k) + 1] for k in range(n)]
    return cx.op("pad", [x], pads=begins + ends, mode="constant", value=float(value))


# ---- indexing ----------------------------------------------------------------------------------
@aten("aten.embedding.default", ["embedding"])
def _embedding(cx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return cx.op("embedding", [weight, indices])


@aten("aten.index_select.default", ["index_select"])
def _index_select(cx, x, dim, index):
    return cx.op("index_select", [x, index], dim=dim % len(x.shape))


@aten("aten.gather.default", ["gather"])
def _gather(cx, x, dim, index, sparse_grad=False):
    return cx.op("gather", [x, index], dim=dim % len(x.shape))


@aten("aten.scatter_add.default", ["scatter_add"])
def _scatter_add(cx, x, dim, index, src):
    return cx.op("scatter_add", [x, index, src], dim=dim % len(x.shape))


@aten("aten.index.Tensor", ["index_select", "gather", "reshape", "expand"],
      "integer index tensors at adjacent dims (broadcast together)")
def _index(cx, x, indices):
    # x[..., i0, i1, ...] with integer index tensors i0..ik-1 at adjacent dims d..d+k-1,
    # broadcast to B: index_select picks along d with i0 (flattened over B), then each further
    # index picks along the next dim with gather, one element per row. Every index is checked
    # (and wrapped when negative) by the op that reads through it, as torch checks each.
    used = [i for i, t in enumerate(indices) if t is not None]
    if not used:
        raise Unsupported("indexing without index tensors")
    if used != list(range(used[0], used[0] + len(used))):
        raise Unsupported("index tensors at non-adjacent dims (torch moves their dims first)")
    if any(indices[i].dtype not in ("i64", "i32") for i in used):
        raise Unsupported("boolean (mask) index tensors")
    d, k = used[0], len(used)
    pre, post = list(x.shape[:d]), list(x.shape[d + k:])
    bshape = _broadcast_shapes([tuple(indices[i].shape) for i in used])
    n = 1
    for s in bshape:
        n = n * s if not (_symbolic(n) or _symbolic(s)) else _sym_mul(n, s)

    def flat(idx):
        if tuple(idx.shape) != bshape:
            idx = cx.op("expand", [idx], shape=list(bshape))
        return cx.op("reshape", [idx], shape=[n]) if len(bshape) != 1 else idx

    y = cx.op("index_select", [x, flat(indices[d])], dim=d)  # [pre, n, x dims d+1.., post]
    for j in range(1, k):
        rest = list(y.shape[d + 2:])
        ones = [1] * len(pre) + [n, 1] + [1] * len(rest)
        idx = cx.op("reshape", [flat(indices[d + j])], shape=ones)
        idx = cx.op("expand", [idx], shape=pre + [n, 1] + rest)
        y = cx.op("gather", [y, idx], dim=d + 1)  # [pre, n, 1, rest]
        y = cx.op("reshape", [y], shape=pre + [n] + rest)
    out = pre + list(bshape) + post
    return y if list(y.shape) == out else cx.op("reshape", [y], shape=out)


def _sym_mul(a, b):
    from .lowering import Sym

    return Sym(f"({a})*({b})")


def _broadcast_shapes(shapes):
    from . import _kiln

    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        # Symbolic sizes compare by their canonical form (equal expressions, equal keys).
        sizes = {(_kiln.symbolic_dim(s) if _symbolic(s) else s): s
                 for s in (s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0)}
        sizes.pop(1, None)
        if len(sizes) > 1:
            raise Unsupported(f"index tensor shapes {shapes} do not broadcast")
        out.append(next(iter(sizes.values())) if sizes else 1)
    return tuple(out)


# ---- tensors made from scalars: constants (broadcast with expand) ------------------------------
@aten("aten.full.default", ["expand"], "a 0-d constant expanded")
def _full(cx, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return cx.filled(fill_value)


@aten("aten.full_like.default", ["expand"], "a 0-d constant expanded")
def _full_like(cx, x, fill_value, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    return cx.filled(fill_value)


@aten("aten.zeros_like.default", ["expand"])
def _zeros_like(cx, x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return cx.filled(0)


@aten("aten.ones_like.default", ["expand"])
def _ones_like(cx, x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return cx.filled(1)


@aten("aten.scalar_tensor.default", [], "a 0-d constant")
def _scalar_tensor(cx, s, dtype=None, layout=None, device=None, pin_memory=None):
    return cx.scalar(s, cx.out_dtype)


@aten("aten.arange.start_step", ["pad"], "a constant (cropped to a symbolic length)")
def _arange(cx, start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    return cx.arange(start, end, step)


@aten("aten.arange.default", ["pad"], "a constant (cropped to a symbolic length)")
def _arange_default(cx, end, dtype=None, layout=None, device=None, pin_memory=None):
    return cx.arange(0, end, 1)


@aten("aten.arange.start", ["pad"], "a constant (cropped to a symbolic length)")
def _arange_start(cx, start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return cx.arange(start, end, 1)
