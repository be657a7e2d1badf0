"""The op mapping: one handler per ATen op, (lowering, node, args, kwargs, out_shape) -> value
(a Val, a Transposed, a Const, or a tuple of those for a node with several outputs)."""
import torch

from .values import Const, Repeated, Transposed, Val

aten = torch.ops.aten


def _identity(L, node, args, kwargs, shape):
    return args[0]


def _reshape(L, node, args, kwargs, shape):
    x = args[0]
    if isinstance(x, Transposed) and len(shape) >= 2 and shape[-2:] == x.shape[-2:]:
        inner = x.val
        v = L.emit("reshape", [inner], shape[:-2] + inner.shape[-2:], inner.dtype,
                   {"shape": shape[:-2] + inner.shape[-2:]})
        return Transposed(v)
    x = L.val(x)
    if x.shape == shape:
        return x
    return L.emit("reshape", [x], shape, x.dtype, {"shape": shape})


def _expand(L, node, args, kwargs, shape):
    x = args[0]
    if list(x.shape) == shape:
        return x
    x = L.val(x)
    if len(x.shape) < len(shape):
        pad = [1] * (len(shape) - len(x.shape)) + x.shape
        x = L.emit("reshape", [x], pad, x.dtype, {"shape": pad})
    return L.emit("broadcast_to", [x], shape, x.dtype, {"shape": shape})


def _transpose(L, node, args, kwargs, shape):
    x = args[0]
    r = len(x.shape)
    if node.target == aten.t.default:
        d0, d1 = 0, 1 if r == 2 else 0
        if r < 2:
            return x
    else:
        d0, d1 = args[1] % r, args[2] % r
    if {d0, d1} == {r - 2, r - 1}:
        return x.val if isinstance(x, Transposed) else Transposed(L.val(x))
    x = L.val(x)
    return L.emit("transpose", [x], shape, x.dtype, {"dim0": d0, "dim1": d1})


def _permute(L, node, args, kwargs, shape):
    x = L.val(args[0])
    order = [d % len(x.shape) for d in args[1]]
    if order == list(range(len(order))):
        return x
    return L.emit("permute", [x], shape, x.dtype, {"order": order})


def _matmul(L, node, args, kwargs, shape):
    a, b = args[0], args[1]
    attrs = {}
    if isinstance(a, Transposed):
        a, attrs["transpose_a"] = a.val, True
    if isinstance(b, Transposed):
        b, attrs["transpose_b"] = b.val, True
    return L.emit("matmul", [L.val(a), L.val(b)], shape, "f32", attrs, hint="matmul")


def _addmm(L, node, args, kwargs, shape):
    bias, a, b = args[0], args[1], args[2]
    if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
        L.fail("addmm with beta or alpha other than 1 is not supported")
    y = _matmul(L, node, [a, b], {}, shape)
    return L.emit("add", [y, L.val(bias)], shape, "f32", hint="bias")


def _baddbmm(L, node, args, kwargs, shape):
    """input + b1 @ b2: nn.MultiheadAttention adds its attn_mask to the scores so; a constant
    causal mask becomes causal_mask, as an added one does."""
    bias, a, b = args[0], args[1], args[2]
    if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
        L.fail("baddbmm with beta or alpha other than 1 is not supported")
    y = _matmul(L, node, [a, b], {}, shape)
    return _binary("add")(L, node, [y, bias], {}, shape)


def _binary(op):
    def lower(L, node, args, kwargs, shape):
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", 1)
        if alpha != 1:
            b_s = L.scalar_of(b)
            if b_s is None:
                b = L.emit("scale", [L.val(b)], list(b.shape), "f32", {"factor": float(alpha)})
            else:
                b = b_s * alpha
        sa, sb = L.scalar_of(a), L.scalar_of(b)
        if op == "mul" and sb is not None and not isinstance(a, Const):
            return L.emit("scale", [L.val(a)], shape, "f32", {"factor": sb})
        if op == "mul" and sa is not None and not isinstance(b, Const):
            return L.emit("scale", [L.val(b)], shape, "f32", {"factor": sa})
        if op == "div" and sb is not None and not isinstance(a, Const):
            if sb == 0.0:
                L.fail("division by the constant 0")
            return L.emit("scale", [L.val(a)], shape, "f32", {"factor": 1.0 / sb})
        if op == "add" and isinstance(b, Const) and b.tensor.dim() >= 2:
            mask = _causal_mask_value(b.tensor, additive=True)
            if mask is not None:
                return L.emit("causal_mask", [L.val(a)], shape, "f32", {"value": mask})
        if op == "sub" and sb == 0.0:
            return a
        if op == "add" and sb == 0.0:
            return a
        return L.emit(op, [_operand(L, a), _operand(L, b)], shape, "f32")
    return lower


def _rsub(L, node, args, kwargs, shape):
    """rsub(x, c) = c - alpha · x (`1.0 - mask`, as Hugging Face's BERT builds its additive
    mask): sub with the operands swapped."""
    return _binary("sub")(L, node, [args[1], args[0]], kwargs, shape)


def _operand(L, x):
    if isinstance(x, (int, float)):
        return L.emit("full", [], [], "f32", {"dtype": "f32", "shape": [], "value": float(x)})
    return L.val(x)


def _causal_mask_value(t, additive):
    """For a mask over the last two axes equal to the causal pattern (true / -inf above the
    diagonal, false / 0 on and below): the value that goes above the diagonal; else None."""
    if t.dim() < 2 or t.shape[-1] != t.shape[-2]:
        return None
    n = t.shape[-1]
    flat = t.reshape(-1, n, n)
    if not bool((flat == flat[0:1]).all()):
        return None
    m = flat[0]
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    if additive:
        if not bool((m[~upper] == 0).all()):
            return None
        vals = m[upper]
        if n > 1 and not bool((vals == vals[0]).all()):
            return None
        return float(vals[0]) if n > 1 else None
    return bool((m == upper).all())


def _masked_fill(L, node, args, kwargs, shape):
    """masked_fill(x, mask, v): causal_mask for a constant causal mask; where(mask, v, x) for a
    mask computed from the inputs (a padding mask, `pad == 0`)."""
    x, mask, value = args[0], args[1], args[2]
    v = L.scalar_of(value)
    if v is None:
        L.fail("masked_fill with a value that is not one number")
    if isinstance(mask, Const) and _causal_mask_value(mask.tensor, False):
        if list(mask.tensor.shape[-2:]) != shape[-2:]:
            L.fail("masked_fill with a causal mask of another size than the scores")
        return L.emit("causal_mask", [L.val(x)], shape, "f32", {"value": v})
    if isinstance(mask, Const):
        L.fail("masked_fill with a constant mask other than a causal one (entries above the "
               "diagonal filled): compute the mask from the inputs, or use a causal one")
    if node.target == aten.masked_fill_.Scalar and list(node.args[0].users) != [node]:
        L.fail("masked_fill_ (in place) on a value something else reads too: write "
               "x = x.masked_fill(mask, value)")
    return L.emit("where", [_condition(L, mask), _operand(L, v), _operand(L, x)], shape, "f32",
                  hint="masked_fill")


def _condition(L, x):
    """A boolean value (a comparison's 0/1 in f32) or a float one used as a condition."""
    x = L.val(x)
    if x.dtype != "f32":
        L.fail(f"a condition of dtype {x.dtype}: compare it first (mask == 1)")
    return x


def _as_f32(L, x):
    """An operand of a comparison: an i64 input (a padding mask, token ids) cast to f32."""
    if isinstance(x, (int, float)):
        return _operand(L, x)
    x = L.val(x)
    if x.dtype == "i64":
        return L.emit("cast", [x], x.shape, "f32", {"dtype": "f32"}, hint="f32")
    return x


def _compare(relation):
    """eq, ne, lt, le, gt, ge: 1 where the relation holds, 0 elsewhere, as f32 (a boolean tensor
    of PyTorch's, which masked_fill, torch.where and `.float()` read so)."""
    def lower(L, node, args, kwargs, shape):
        return L.emit("compare", [_as_f32(L, args[0]), _as_f32(L, args[1])], shape, "f32",
                      {"relation": relation})
    return lower


def _logical_not(L, node, args, kwargs, shape):
    x = _condition(L, args[0])
    if node.target == aten.bitwise_not.default and L.concrete[node].dtype != torch.bool:
        L.fail("bitwise_not of integers")
    zero = _operand(L, 0.0)
    return L.emit("compare", [x, zero], shape, "f32", {"relation": "eq"}, hint="not")


def _where(L, node, args, kwargs, shape):
    cond, a, b = args[0], args[1], args[2]
    return L.emit("where", [_condition(L, cond), _operand(L, a), _operand(L, b)], shape, "f32")


def _clamp(L, node, args, kwargs, shape):
    """clamp, clamp_min, clamp_max as where(x < low, low, x) (and the same for high): the
    gradient passes to x where it was kept, as PyTorch's does (x >= min and x <= max)."""
    x = L.val(args[0])
    if node.target == aten.clamp_max.default:
        low, high = None, args[1]
    else:
        low = args[1] if len(args) > 1 else kwargs.get("min")
        high = args[2] if len(args) > 2 else kwargs.get("max")
        if node.target == aten.clamp_min.default:
            high = None
    for bound, relation in ((low, "lt"), (high, "gt")):
        if bound is None:
            continue
        if L.scalar_of(bound) is None:
            L.fail("clamp by a tensor bound: only numbers are supported")
        b = _operand(L, L.scalar_of(bound))
        out = L.emit("compare", [x, b], shape, "f32", {"relation": relation}, hint="outside")
        x = L.emit("where", [out, b, x], shape, "f32", hint="clamped")
    return x


def _hardtanh(L, node, args, kwargs, shape):
    """nn.Hardtanh and nn.ReLU6 (hardtanh(0, 6)) as sluice's hardtanh, whose gradient passes
    strictly between the bounds, as PyTorch's hardtanh_backward."""
    low = args[1] if len(args) > 1 else kwargs.get("min_val", -1.0)
    high = args[2] if len(args) > 2 else kwargs.get("max_val", 1.0)
    return L.emit("hardtanh", [L.val(args[0])], shape, "f32",
                  {"min_val": float(low), "max_val": float(high)})


def _norm(L, node, args, kwargs, shape):
    """The 2-norm along axes (F.normalize's denominator): sqrt(sum(x·x))."""
    x = L.val(args[0])
    p = args[1] if len(args) > 1 else kwargs.get("p", 2)
    dims = args[2] if len(args) > 2 else kwargs.get("dim")
    keep = args[3] if len(args) > 3 else kwargs.get("keepdim", False)
    if L.scalar_of(p) != 2.0:
        L.fail(f"a norm of order {p}: only the 2-norm is supported")
    if dims is None:
        dims = list(range(len(x.shape)))
    dims = [dims] if isinstance(dims, int) else dims
    sq = L.emit("mul", [x, x], x.shape, "f32", hint="square")
    s = L.emit("sum", [sq], shape, "f32", {"axes": [d % len(x.shape) for d in dims],
                                           "keepdims": bool(keep)})
    return L.emit("sqrt", [s], shape, "f32")


def _to_copy(L, node, args, kwargs, shape):
    """`.float()` / `.to(torch.float32)`: an i64 value cast, a boolean one (already 0/1 in f32) or
    an f32 one kept."""
    dtype = kwargs.get("dtype")
    x = args[0]
    if dtype not in (None, torch.float32):
        L.fail(f"a conversion to {dtype}: sluice computes in f32")
    x = L.val(x)
    if x.dtype == "i64":
        return L.emit("cast", [x], shape, "f32", {"dtype": "f32"})
    return x


def _full_like(value):
    def lower(L, node, args, kwargs, shape):
        dtype = kwargs.get("dtype", L.concrete[node].dtype)
        if dtype not in (torch.float32, torch.bool):
            L.fail(f"a tensor like another of dtype {dtype}: sluice computes in f32")
        return L.emit("full", [], shape, "f32", {"dtype": "f32", "shape": shape, "value": value})
    return lower


def _unary(op):
    def lower(L, node, args, kwargs, shape):
        return L.emit(op, [L.val(args[0])], shape, "f32")
    return lower


def _gelu(L, node, args, kwargs, shape):
    approximate = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
    op = {"tanh": "gelu", "none": "gelu_erf"}.get(approximate)
    if op is None:
        L.fail(f"gelu with approximate={approximate!r}")
    return L.emit(op, [L.val(args[0])], shape, "f32")


def _leaky_relu(L, node, args, kwargs, shape):
    slope = args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01)
    return L.emit("leaky_relu", [L.val(args[0])], shape, "f32", {"slope": float(slope)})


def _softplus(L, node, args, kwargs, shape):
    beta = args[1] if len(args) > 1 else kwargs.get("beta", 1)
    threshold = args[2] if len(args) > 2 else kwargs.get("threshold", 20)
    return L.emit("softplus", [L.val(args[0])], shape, "f32",
                  {"beta": float(beta), "threshold": float(threshold)})


def _sigmoid(L, node, args, kwargs, shape):
    return L.emit("sigmoid", [L.val(args[0])], shape, "f32")


def _silu(L, node, args, kwargs, shape):
    return L.emit("silu", [L.val(args[0])], shape, "f32")


def _mish(L, node, args, kwargs, shape):
    """nn.Mish: x · tanh(softplus(x)) (PyTorch's softplus threshold 20)."""
    x = L.val(args[0])
    s = L.emit("softplus", [x], shape, "f32", {"beta": 1.0, "threshold": 20.0})
    t = L.emit("tanh", [s], shape, "f32")
    return L.emit("mul", [x, t], shape, "f32", hint="mish")


def _hardswish(L, node, args, kwargs, shape):
    """nn.Hardswish: x · clamp(x + 3, 0, 6) / 6, the clamp as `compare` and `where` (its gradient
    0 below −3, 1 above 3 and (2x + 3) / 6 between, as PyTorch's)."""
    x = L.val(args[0])
    three = _operand(L, 3.0)
    h = L.emit("add", [x, three], shape, "f32", hint="shifted")
    for bound, relation in ((0.0, "lt"), (6.0, "gt")):
        b = _operand(L, bound)
        out = L.emit("compare", [h, b], shape, "f32", {"relation": relation}, hint="outside")
        h = L.emit("where", [out, b, h], shape, "f32", hint="clamped")
    h = L.emit("scale", [h], shape, "f32", {"factor": 1.0 / 6.0}, hint="gate")
    return L.emit("mul", [x, h], shape, "f32", hint="hardswish")


def _rsqrt(L, node, args, kwargs, shape):
    s = L.emit("sqrt", [L.val(args[0])], shape, "f32")
    one = L.emit("full", [], [], "f32", {"dtype": "f32", "shape": [], "value": 1.0}, hint="one")
    return L.emit("div", [one, s], shape, "f32", hint="rsqrt")


def _pow(L, node, args, kwargs, shape):
    e = L.scalar_of(args[1])
    x = L.val(args[0])
    if e == 2.0:
        return L.emit("mul", [x, x], shape, "f32", hint="square")
    if e == 1.0:
        return x
    if e == 0.5:
        return L.emit("sqrt", [x], shape, "f32")
    L.fail(f"pow with exponent {args[1]}: only 2, 1 and 0.5 are supported")


def _amax(L, node, args, kwargs, shape):
    """x.amax(-1) (a max over time, [B, C, L] -> [B, C]) as a max_pool2d of x seen as [N, 1, 1, L]
    with one window of L. Its gradient goes to the first largest element, where PyTorch's splits
    it among ties (equal floats, as zeros after a ReLU, whose own gradient is zero there)."""
    x = L.val(args[0])
    dims = args[1] if len(args) > 1 else kwargs.get("dim", [])
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    dims = [dims] if isinstance(dims, int) else list(dims)
    r = len(x.shape)
    if [d % r for d in dims] != [r - 1] or r < 2:
        L.fail(f"amax over dims {dims} of a rank-{r} value: only the last axis is mapped")
    n, length = 1, x.shape[-1]
    for d in x.shape[:-1]:
        n *= d
    images = [n, 1, 1, length]
    v = L.emit("reshape", [x], images, "f32", {"shape": images}, hint="rows")
    pooled = [n, 1, 1, 1]
    v = L.emit("max_pool2d", [v], pooled, "f32", {"kernel": [1, length], "stride": [1, length],
                                                  "padding": [0, 0]})
    return L.emit("reshape", [v], shape, "f32", {"shape": shape}, hint="amax")


def _reduce(op):
    def lower(L, node, args, kwargs, shape):
        x = L.val(args[0])
        dims = args[1] if len(args) > 1 and args[1] is not None else []
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if "dtype" in kwargs and kwargs["dtype"] not in (None, torch.float32):
            L.fail(f"{op} to {kwargs['dtype']}")
        axes = [d % len(x.shape) for d in dims]
        return L.emit(op, [x], shape, "f32", {"axes": axes, "keepdims": bool(keep)})
    return lower


def _layer_norm(L, node, args, kwargs, shape):
    x, normalized, w, b, eps = args
    if len(normalized) != 1:
        L.fail("layer_norm over more than the last axis is not supported")
    c = [int(normalized[0])]
    # Without elementwise_affine: a weight of ones and a bias of zeros, which nothing trains.
    w = L.val(w) if w is not None else L.emit("full", [], c, "f32", {"dtype": "f32", "shape": c,
                                                                     "value": 1.0}, hint="ones")
    b = L.val(b) if b is not None else L.emit("full", [], c, "f32", {"dtype": "f32", "shape": c,
                                                                     "value": 0.0}, hint="zeros")
    shape = list(L.concrete[node][0].shape)
    y = L.emit("layer_norm", [L.val(x), w, b], shape, "f32", {"eps": float(eps)})
    return (y, None, None)


def _full_of(L, shape, value, hint):
    return L.emit("full", [], shape, "f32", {"dtype": "f32", "shape": shape, "value": value},
                  hint=hint)


def _group_norm(L, node, args, kwargs, shape):
    """nn.GroupNorm: each group's channels and pixels normalised together (a layer norm over the
    group reshaped to one axis), then the per-channel weight and bias."""
    x, w, b, n, c, hw, groups, eps = args
    x = L.val(x)
    shape = list(L.concrete[node][0].shape)
    rows = [x.shape[0], groups, (c // groups) * hw]
    g = L.emit("reshape", [x], rows, "f32", {"shape": rows}, hint="groups")
    ones, zeros = _full_of(L, rows[-1:], 1.0, "ones"), _full_of(L, rows[-1:], 0.0, "zeros")
    y = L.emit("layer_norm", [g, ones, zeros], rows, "f32", {"eps": float(eps)})
    per_channel = [x.shape[0], c, hw]
    y = L.emit("reshape", [y], per_channel, "f32", {"shape": per_channel}, hint="channels")
    if w is not None:
        wv = L.emit("reshape", [L.val(w)], [c, 1], "f32", {"shape": [c, 1]}, hint="weight")
        y = L.emit("mul", [y, wv], per_channel, "f32", hint="scaled")
    if b is not None:
        bv = L.emit("reshape", [L.val(b)], [c, 1], "f32", {"shape": [c, 1]}, hint="bias")
        y = L.emit("add", [y, bv], per_channel, "f32", hint="shifted")
    y = L.emit("reshape", [y], shape, "f32", {"shape": shape}, hint="group_norm")
    return (y, None, None)


def _batch_norm(L, node, args, kwargs, shape):
    """nn.BatchNorm1d/2d. In training mode: batch_norm by the batch's statistics, then
    batch_norm_update_stats moving the running mean and variance (`buffer`s) towards them, as
    PyTorch's forward does in place. In eval mode (a frozen batch norm): batch_norm by the running
    statistics, read as constants. No weight or bias (affine=False): ones and zeros."""
    x, w, b, running_mean, running_var, training, momentum, eps = args
    x = L.val(x)
    c = x.shape[1]
    w = L.val(w) if w is not None else _full_of(L, [c], 1.0, "ones")
    b = L.val(b) if b is not None else _full_of(L, [c], 0.0, "zeros")
    if running_mean is None or running_var is None:
        L.fail("batch norm without running statistics (track_running_stats=False) is not mapped: "
               "sluice evaluates batch norm by its running statistics")
    if training:
        mean, var = L.running_buffer(running_mean), L.running_buffer(running_var)
    else:
        mean, var = L.val(running_mean), L.val(running_var)
    y = L.emit("batch_norm", [x, w, b, mean, var], list(x.shape), "f32",
               {"eps": float(eps), "training": bool(training)})
    if training:
        L.emit_multi("batch_norm_update_stats", [x, mean, var], [], {"momentum": float(momentum)})
    return (y, None, None)


def _convolution(L, node, args, kwargs, shape):
    """nn.Conv2d (and nn.Conv1d, as a conv2d over images of one row) as conv2d with its groups and
    dilation; nn.ConvTranspose2d (and 1d) as conv2d_grad_input, the input gradient of the
    convolution it transposes (its output size gives output_padding); the bias added per output
    channel."""
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args
    x, w = L.val(x), L.val(w)
    stride, padding, dilation = list(stride), list(padding), list(dilation)
    if len(x.shape) == 3:  # conv1d: [B, C, L] as [B, C, 1, L]
        xs, ws = x.shape[:2] + [1, x.shape[2]], w.shape[:2] + [1, w.shape[2]]
        x = L.emit("reshape", [x], xs, "f32", {"shape": xs}, hint="rows")
        w = L.emit("reshape", [w], ws, "f32", {"shape": ws}, hint="filters")
        stride, padding, dilation = [1] + stride, [0] + padding, [1] + dilation
        out = shape[:2] + [1, shape[2]]
    elif len(x.shape) == 4:
        out = shape
    else:
        L.fail(f"a convolution of a {len(x.shape)}-D input: sluice maps conv1d and conv2d")
    attrs = {"stride": stride, "padding": padding}
    if dilation != [1, 1]:
        attrs["dilation"] = dilation
    if groups != 1:
        attrs["groups"] = groups
    if transposed:
        # conv_transpose2d(x, w) is the input gradient of conv2d(·, w) at the output's size.
        attrs.update(height=out[2], width=out[3])
        y = L.emit("conv2d_grad_input", [x, w], out, "f32", attrs, hint="transposed")
    else:
        y = L.emit("conv2d", [x, w], out, "f32", attrs)
    if b is not None:
        o = out[1]
        bv = L.emit("reshape", [L.val(b)], [o, 1, 1], "f32", {"shape": [o, 1, 1]}, hint="bias")
        y = L.emit("add", [y, bv], out, "f32", hint="biased")
    if out != shape:
        y = L.emit("reshape", [y], shape, "f32", {"shape": shape})
    return y


def _upsample_nearest2d(L, node, args, kwargs, shape):
    """F.interpolate / nn.Upsample, mode 'nearest', by whole factors: each pixel repeated s_h × s_w
    times in place, as x [B, C, H, 1, W, 1] broadcast to [B, C, H, s_h, W, s_w] (its gradient
    sums the copies back)."""
    x = L.val(args[0])
    if len(x.shape) != 4:
        L.fail("upsample_nearest2d of an input that is not [B, C, H, W]")
    n, c, h, w = x.shape
    oh, ow = shape[2], shape[3]
    if oh % h != 0 or ow % w != 0:
        L.fail(f"nearest upsampling from {h}x{w} to {oh}x{ow}: sluice repeats pixels by whole "
               f"factors (scale_factor an integer, or a size that is a multiple of the input's)")
    sh, sw = oh // h, ow // w
    scales = args[2] if len(args) > 2 else kwargs.get("scale_factors")
    if scales is not None and any(float(f) != int(f) for f in scales):
        L.fail(f"nearest upsampling by scale_factor={list(scales)}: sluice repeats pixels by "
               f"whole factors")
    if (sh, sw) == (1, 1):
        return x
    inner, wide = [n, c, h, 1, w, 1], [n, c, h, sh, w, sw]
    y = L.emit("reshape", [x], inner, "f32", {"shape": inner}, hint="pixels")
    y = L.emit("broadcast_to", [y], wide, "f32", {"shape": wide}, hint="repeated")
    return L.emit("reshape", [y], shape, "f32", {"shape": shape}, hint="upsampled")


def _pool_args(L, what, kernel, stride, padding, ceil_mode):
    pair = lambda v: [v, v] if isinstance(v, int) else list(v) * (2 // len(v))  # noqa: E731
    kernel = pair(kernel)
    stride = pair(stride) if stride else kernel
    padding = pair(padding)
    if ceil_mode:
        L.fail(f"{what} with ceil_mode=True: sluice pools windows that fit (ceil_mode=False)")
    return {"kernel": kernel, "stride": stride, "padding": padding}


def _max_pool2d(L, node, args, kwargs, shape):
    x, kernel = args[0], args[1]
    stride = args[2] if len(args) > 2 else []
    padding = args[3] if len(args) > 3 else 0
    dilation = args[4] if len(args) > 4 else 1
    ceil_mode = args[5] if len(args) > 5 else False
    if any(d != 1 for d in ([dilation] if isinstance(dilation, int) else dilation)):
        L.fail(f"max_pool2d with dilation={dilation}: sluice's max_pool2d has dilation 1")
    x = L.val(x)
    if len(x.shape) != 4:
        L.fail("max_pool2d of an input that is not [B, C, H, W]")
    attrs = _pool_args(L, "max_pool2d", kernel, stride, padding, ceil_mode)
    shape = list(L.concrete[node][0].shape)
    return (L.emit("max_pool2d", [x], shape, "f32", attrs), None)


def _avg_pool2d(L, node, args, kwargs, shape):
    x, kernel = args[0], args[1]
    stride = args[2] if len(args) > 2 else []
    padding = args[3] if len(args) > 3 else 0
    ceil_mode = args[4] if len(args) > 4 else False
    count_include_pad = args[5] if len(args) > 5 else True
    divisor = args[6] if len(args) > 6 else None
    attrs = _pool_args(L, "avg_pool2d", kernel, stride, padding, ceil_mode)
    if divisor is not None or (not count_include_pad and any(attrs["padding"])):
        L.fail("avg_pool2d with divisor_override or count_include_pad=False: sluice's divides "
               "by the window's size, the padding counted")
    x = L.val(x)
    if len(x.shape) != 4:
        L.fail("avg_pool2d of an input that is not [B, C, H, W]")
    return L.emit("avg_pool2d", [x], shape, "f32", attrs)


def _softmax(L, node, args, kwargs, shape):
    x, dim = args[0], args[1]
    if dim % len(shape) != len(shape) - 1:
        L.fail("softmax over an axis other than the last")
    return L.emit("softmax", [L.val(x)], shape, "f32")


def _log_softmax(L, node, args, kwargs, shape):
    x, dim = args[0], args[1]
    if dim % len(shape) != len(shape) - 1:
        L.fail("log_softmax over an axis other than the last")
    users = list(node.users)
    if not all(u.target in (aten.nll_loss_forward.default, aten.detach.default) for u in users):
        L.fail("log_softmax is supported only as the input of nll_loss (cross-entropy)")
    return ("log_softmax", L.val(x))


def _nll_loss(L, node, args, kwargs, shape):
    logp, targets, weight, reduction, ignore = args
    if not (isinstance(logp, tuple) and logp[0] == "log_softmax"):
        L.fail("nll_loss is supported only on log_softmax (F.cross_entropy)")
    return (cross_entropy(L, logp[1], targets, weight, reduction, ignore), None)


def cross_entropy(L, logits, targets, weight, reduction, ignore, smoothing=0.0):
    """F.cross_entropy of logits (a Val) as sluice's cross_entropy: reduction 1 (mean) or 2
    (sum), label smoothing ε."""
    if weight is not None:
        L.fail("cross-entropy with class weights")
    if reduction not in (1, 2):
        L.fail("cross-entropy with reduction='none': the loss must be one number (write "
               "reduction='mean' or 'sum', or .mean() after it)")
    if ignore not in (-1, -100):
        L.fail(f"cross-entropy with ignore_index={ignore}: sluice ignores targets of -1 "
               f"(write ignore_index=-1)")
    attrs = {}
    if reduction == 2:
        attrs["reduction"] = "sum"
    if smoothing:
        attrs["label_smoothing"] = float(smoothing)
    return L.emit("cross_entropy", [logits, L.val(targets)], [], "f32", attrs or None,
                  hint="loss")


def _embedding(L, node, args, kwargs, shape):
    table, ids = args[0], args[1]
    # padding_idx: the row PyTorch never trains (its gradient is zero); sluice's embedding_grad
    # leaves it zero too ({padding_idx = p}).
    padding_idx = args[2] if len(args) > 2 else kwargs.get("padding_idx", -1)
    if (args[3] if len(args) > 3 else kwargs.get("scale_grad_by_freq", False)):
        L.fail("nn.Embedding with scale_grad_by_freq=True: sluice's embedding gradient is not "
               "scaled by frequency")
    if isinstance(ids, Const):
        t = ids.tensor
        n = t.shape[-1] if t.dim() > 0 else 0
        if t.dim() == 1 and bool((t == torch.arange(n)).all()) and padding_idx == -1:
            table = L.val(table)
            return L.emit("slice", [table], shape, "f32", {"axis": 0, "start": 0, "end": n})
        L.fail("embedding of constant ids other than arange(0, n)")
    attrs = {"padding_idx": int(padding_idx)} if padding_idx != -1 else None
    return L.emit("embedding", [L.val(ids), L.val(table)], shape, "f32", attrs)


def _slice(L, node, args, kwargs, shape):
    x = args[0]
    dim = args[1] if len(args) > 1 else 0
    start = args[2] if len(args) > 2 else None
    end = args[3] if len(args) > 3 else None
    step = args[4] if len(args) > 4 else 1
    if step != 1:
        L.fail("slicing with a step other than 1")
    if (start or 0) == 0 and (end is None or end >= 2**62):
        return x  # an open slice `x[:]`: the whole axis at every size
    x = L.val(x)
    r = len(x.shape)
    dim %= r
    n = x.shape[dim]
    start = 0 if start is None else (start + n if start < 0 else start)
    start = min(max(start, 0), n)
    stop = start + shape[dim]
    return L.emit("slice", [x], shape, x.dtype, {"axis": dim, "start": start, "end": stop})


def _select(L, node, args, kwargs, shape):
    x = L.val(args[0])
    dim, index = args[1] % len(x.shape), args[2]
    if index < 0:
        index += x.shape[dim]
    part = x.shape[:dim] + [1] + x.shape[dim + 1:]
    s = L.emit("slice", [x], part, x.dtype, {"axis": dim, "start": index, "end": index + 1})
    return L.emit("reshape", [s], shape, x.dtype, {"shape": shape})


def _split(L, node, args, kwargs, shape):
    x = L.val(args[0])
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % len(x.shape)
    pieces = [list(t.shape) for t in L.concrete[node]]
    sizes = [p[dim] for p in pieces]
    base = L.fresh("split")
    outs = [Val(f"{base}.{i}", p, x.dtype) for i, p in enumerate(pieces)]
    # Pieces along the first axis are contiguous ranges of x: views (a recurrent layer's input
    # projection cut into its T steps), no copy. Elsewhere copies.
    L.emit_multi("split_view" if dim == 0 else "split", [x], outs, {"axis": dim, "sizes": sizes})
    return tuple(outs)


def _cat(L, node, args, kwargs, shape):
    xs = [L.val(x) for x in args[0]]
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % len(shape)
    return L.emit("concat", xs, shape, xs[0].dtype, {"axis": dim})


def _unsqueeze_squeeze(L, node, args, kwargs, shape):
    x = L.val(args[0])
    if x.shape == shape:
        return x
    return L.emit("reshape", [x], shape, x.dtype, {"shape": shape})


def _dropout(L, node, args, kwargs, shape):
    """aten.native_dropout(x, p, train): sluice's dropout in training with p > 0, x otherwise; its
    mask (output 1) is never computed."""
    x, p, train = args[0], args[1], args[2]
    if train and p:
        return (L.dropout(L.val(x), p), None)
    return (x, None)


def _empty_like(L, node, args, kwargs, shape):
    """PyTorch 1.13 traces dropout in training as empty_like, bernoulli_(1 - p), div_, mul, which
    the lowering maps to one dropout (find_dropouts); an empty_like left over is a mask in another
    form, so the error names dropout rather than empty_like."""
    for user in node.users:
        if user.target in (aten.bernoulli_.float, aten.bernoulli.p):
            p = 1 - user.args[1]
            L.fail(f"dropout with p={p:.6g} in training mode whose mask is used otherwise than as "
                   f"x * mask / (1 - p): sluice draws a dropout's mask itself and never stores it; "
                   f"use nn.Dropout or F.dropout, or export with --without-dropout (every "
                   f"nn.Dropout and nn.MultiheadAttention dropout as p=0)")
    L.fail(f"unsupported ATen op {node.target}: sluice has no mapping for it "
           f"(docs/torch-export.md lists the supported ops)")


def _repeat_axis(L, x, dim, repeats, shape):
    """x with each entry along `dim` repeated `repeats` times in place (repeat_interleave), as a
    Repeated that the first reader materialises (repeat_copy) unless it reads it in place."""
    x = L.val(x)
    if repeats == 1:
        return x
    return Repeated(x, dim, repeats, shape)


def repeat_copy(L, r):
    """A Repeated materialised: a new axis of 1 after dim, broadcast to `repeats`, merged back
    into dim."""
    x, dim, repeats, shape = r.val, r.dim, r.repeats, r.shape
    inner = x.shape[:dim + 1] + [1] + x.shape[dim + 1:]
    wide = x.shape[:dim + 1] + [repeats] + x.shape[dim + 1:]
    y = L.emit("reshape", [x], inner, x.dtype, {"shape": inner}, hint="unsqueeze")
    y = L.emit("broadcast_to", [y], wide, x.dtype, {"shape": wide}, hint="repeat")
    return L.emit("reshape", [y], shape, x.dtype, {"shape": shape})


def _repeat_interleave(L, node, args, kwargs, shape):
    x, repeats = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim")
    if dim is None or not isinstance(repeats, int):
        L.fail("repeat_interleave without a dim or with repeats given as a tensor")
    return _repeat_axis(L, x, dim % len(x.shape), repeats, shape)


def _index_select(L, node, args, kwargs, shape):
    """index_select by constant indices: repeat_interleave (grouped-query attention's keys and
    values, which PyTorch traces as index_select by [0, 0, 1, 1, ...]) or all of the axis."""
    x, dim, index = args[0], args[1], args[2]
    if not isinstance(index, Const) or index.tensor.dim() != 1:
        L.fail("index_select by indices computed from the inputs: only constant indices that "
               "repeat each entry (repeat_interleave) are supported")
    dim %= len(x.shape)
    n, idx = x.shape[dim], index.tensor
    if n > 0 and idx.numel() % n == 0:
        r = idx.numel() // n
        if bool((idx == torch.arange(n).repeat_interleave(r)).all()):
            return _repeat_axis(L, x, dim, r, shape)
    L.fail(f"index_select along axis {dim} by constant indices {idx.tolist()[:8]}...: only "
           f"indices that repeat each entry in place (repeat_interleave) are supported")


LOWERINGS = {
    aten.view.default: _reshape, aten._unsafe_view.default: _reshape,
    aten._reshape_alias.default: _reshape, aten.reshape.default: _reshape,
    aten.clone.default: _identity, aten.detach.default: _identity, aten.alias.default: _identity,
    aten.contiguous.default: _identity, aten.lift_fresh_copy.default: _identity,
    aten.expand.default: _expand,
    aten.t.default: _transpose, aten.transpose.int: _transpose, aten.permute.default: _permute,
    aten.mm.default: _matmul, aten.bmm.default: _matmul, aten.matmul.default: _matmul,
    aten.addmm.default: _addmm, aten.baddbmm.default: _baddbmm,
    aten.add.Tensor: _binary("add"), aten.sub.Tensor: _binary("sub"),
    aten.rsub.Scalar: _rsub,
    aten.mul.Tensor: _binary("mul"), aten.div.Tensor: _binary("div"),
    aten.add.Scalar: _binary("add"), aten.mul.Scalar: _binary("mul"),
    aten.masked_fill.Scalar: _masked_fill, aten.masked_fill_.Scalar: _masked_fill,
    aten.masked_fill.Tensor: _masked_fill,
    aten.eq.Scalar: _compare("eq"), aten.eq.Tensor: _compare("eq"),
    aten.ne.Scalar: _compare("ne"), aten.ne.Tensor: _compare("ne"),
    aten.lt.Scalar: _compare("lt"), aten.lt.Tensor: _compare("lt"),
    aten.le.Scalar: _compare("le"), aten.le.Tensor: _compare("le"),
    aten.gt.Scalar: _compare("gt"), aten.gt.Tensor: _compare("gt"),
    aten.ge.Scalar: _compare("ge"), aten.ge.Tensor: _compare("ge"),
    aten.logical_not.default: _logical_not, aten.bitwise_not.default: _logical_not,
    aten.where.self: _where, aten.where.ScalarSelf: _where, aten.where.ScalarOther: _where,
    aten.where.Scalar: _where,
    aten.hardtanh.default: _hardtanh,
    aten.clamp.default: _clamp, aten.clamp_min.default: _clamp, aten.clamp_max.default: _clamp,
    aten.norm.ScalarOpt_dim: _norm, aten.linalg_vector_norm.default: _norm,
    aten._to_copy.default: _to_copy,
    aten.zeros_like.default: _full_like(0.0), aten.ones_like.default: _full_like(1.0),
    aten.neg.default: _unary("neg"), aten.exp.default: _unary("exp"),
    aten.log.default: _unary("log"), aten.sqrt.default: _unary("sqrt"),
    aten.tanh.default: _unary("tanh"), aten.relu.default: _unary("relu"),
    aten.gelu.default: _gelu, aten.silu.default: _silu, aten.sigmoid.default: _sigmoid,
    aten.mish.default: _mish, aten.hardswish.default: _hardswish,
    aten.leaky_relu.default: _leaky_relu, aten.softplus.default: _softplus,
    aten.rsqrt.default: _rsqrt, aten.pow.Tensor_Scalar: _pow,
    aten.mean.dim: _reduce("mean"), aten.mean.default: _reduce("mean"), aten.sum.dim_IntList: _reduce("sum"), aten.amax.default: _amax,
    aten.native_layer_norm.default: _layer_norm,
    aten.native_group_norm.default: _group_norm, aten.native_batch_norm.default: _batch_norm,
    aten.convolution.default: _convolution, aten.upsample_nearest2d.vec: _upsample_nearest2d,
    aten.max_pool2d_with_indices.default: _max_pool2d, aten.avg_pool2d.default: _avg_pool2d,
    aten._softmax.default: _softmax, aten._log_softmax.default: _log_softmax,
    aten.nll_loss_forward.default: _nll_loss,
    aten.embedding.default: _embedding,
    aten.slice.Tensor: _slice, aten.select.int: _select,
    aten.split.Tensor: _split, aten.split_with_sizes.default: _split,
    aten.cat.default: _cat,
    aten.unsqueeze.default: _unsqueeze_squeeze, aten.squeeze.dim: _unsqueeze_squeeze,
    aten.squeeze.default: _unsqueeze_squeeze,
    aten.native_dropout.default: _dropout, aten.empty_like.default: _empty_like,
    aten.repeat_interleave.self_int: _repeat_interleave,
    aten.index_select.default: _index_select,
}
