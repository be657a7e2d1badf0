"""What a graph node lowers to, and how program text writes types and attributes."""
import json
import math

import torch


class Val:
    """A value of the program: %name, its shape and dtype (f32 or i64)."""

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, list(shape), dtype


class Transposed:
    """The last two axes of a Val swapped, not yet materialised (a matmul takes it as is)."""

    def __init__(self, val):
        self.val = val
        self.shape = val.shape[:-2] + [val.shape[-1], val.shape[-2]]
        self.dtype = val.dtype


class Repeated:
    """A Val with each entry along `dim` repeated `repeats` times in place (repeat_interleave),
    not yet materialised: causal_attention reads grouped-query keys and values so, in place;
    anything else gets the copy (Lowering.val)."""

    def __init__(self, val, dim, repeats, shape):
        self.val, self.dim, self.repeats = val, dim, repeats
        self.shape = list(shape)
        self.dtype = val.dtype
        self.materialized = None


class Const:
    """A value that depends on no input or parameter: folded. `origin` is the graph node that
    computed it; when it derives from a buffer and an instruction needs it as a tensor, that node
    is lowered for real, reading the buffer as a program constant (Lowering.materialize)."""

    def __init__(self, tensor, origin=None):
        self.tensor = tensor
        self.origin = origin
        self.shape = list(tensor.shape)
        self.dtype = DTYPES.get(tensor.dtype)


DTYPES = {torch.float32: "f32", torch.int64: "i64"}


def fmt_float(x):
    x = float(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if math.isnan(x):
        return "nan"
    return repr(x)


def fmt_attr(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return fmt_float(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(str(int(i)) for i in v) + "]"


def fmt_type(dtype, shape):
    return f"{dtype}[{', '.join(str(int(d)) for d in shape)}]"
