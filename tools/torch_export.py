#!/usr/bin/python3
"""Export a PyTorch nn.Module as a sluice training program and its initial weights.

Usage: /usr/bin/python3 tools/torch_export.py FILE.py:FACTORY --batch B --seq T --out DIR

Imports FILE.py, calls FACTORY() for the module, whose forward(tokens, targets) (int64 [B, T] each)
returns the mean next-token cross-entropy, and writes
  DIR/model.sluice      the forward pass and loss as a program `sluice train --program` trains:
                        inputs %tokens (= tokens) and %targets (= next_tokens), one `param` per
                        named_parameters() entry (`= loaded`, PyTorch layout), units from the
                        module tree, batch and sequence sizes written B and T;
  DIR/init.safetensors  the module's parameters under their named_parameters() names.

How (docs/torch-export.md has the op table and the limits):
  1. Trace: make_fx over a call of the module whose parameters are swapped for placeholders (every
     alias of a tied Parameter gets the same one), at (B, T) and again at smaller sizes. Forward
     hooks record which module each ATen node comes from and the user's source line.
  2. Map: each ATen node becomes sluice instructions (Lowering). Values that depend on no input or
     parameter (arange, masks, index arithmetic) are folded to constants; a constant causal mask
     becomes causal_mask. A transpose feeding a matmul becomes its transpose_a/transpose_b.
  3. Generalise: every integer that differs between the two texts is written as a product of B and
     T and a factor that gives both (as sluice's GeneraliseSizes does for `sluice export`).
  4. Write both files into a fresh folder beside DIR and rename it to DIR: nothing half-written.

Only the standard library and torch (Debian's python3-torch, PyTorch 1.13) are used.
"""
import argparse
import importlib.util
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile
import traceback

import torch
import torch.fx as fx
from torch.fx.experimental import proxy_tensor

aten = torch.ops.aten


class ExportError(Exception):
    """A problem with the user's module or arguments; main() prints it and exits 1."""


class AmbiguousSizes(ExportError):
    """An integer that the second trace's sizes cannot attribute to one product of B and T."""


# ---------------------------------------------------------------------------------------------
# Loading the module

def load_module(spec_text):
    path, sep, factory = spec_text.rpartition(":")
    if not sep or not path or not factory:
        raise ExportError(f"'{spec_text}': expected FILE.py:FACTORY, e.g. models.py:gpt")
    if not os.path.isfile(path):
        raise ExportError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location("sluice_user_module", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        raise ExportError(f"{path}: importing it raised {type(e).__name__}: {e}") from e
    fn = getattr(mod, factory, None)
    if fn is None or not callable(fn):
        raise ExportError(f"{path} has no function '{factory}'")
    try:
        module = fn()
    except Exception as e:
        raise ExportError(f"{path}:{factory}() raised {type(e).__name__}: {e}") from e
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"{path}:{factory}() returned {type(module).__name__}, not a torch.nn.Module")
    if not list(module.parameters()):
        raise ExportError(f"{path}:{factory}() returned a module with no parameters: nothing to train")
    return module, os.path.abspath(path)


def parameter_aliases(module):
    """[(name, Parameter, [(owner module, attribute), ...])] in named_parameters() order; a tied
    Parameter appears once, under its first name, with every (module, attribute) holding it."""
    names = {id(p): n for n, p in module.named_parameters()}
    order = [n for n, _ in module.named_parameters()]
    holders = {}
    for _, sub in module.named_modules(remove_duplicate=False):
        for attr, p in sub._parameters.items():
            if p is not None and id(p) in names:
                holders.setdefault(id(p), []).append((sub, attr))
    out = []
    for n, p in module.named_parameters():
        hs = list(dict.fromkeys(holders[id(p)]))
        out.append((n, p, hs))
    assert [n for n, _, _ in out] == order
    return out


def block_paths(module):
    """Module paths of the units: each element of an outermost nn.ModuleList/nn.Sequential."""
    paths = []
    for path, sub in module.named_modules():
        if not isinstance(sub, (torch.nn.ModuleList, torch.nn.Sequential)) or not path:
            continue
        if any(path.startswith(p + ".") for p in paths):
            continue  # inside a block already
        for name, _ in sub.named_children():
            paths.append(f"{path}.{name}")
    return paths


# ---------------------------------------------------------------------------------------------
# Tracing

class _Recorder:
    """The module path and user source line current while tracing, stamped on every node."""

    def __init__(self, module, user_file):
        self.stack = [""]
        self.user_file = user_file
        self.handles = []
        for path, sub in module.named_modules():
            self.handles.append(sub.register_forward_pre_hook(self._enter(path)))
            self.handles.append(sub.register_forward_hook(self._leave()))

    def _enter(self, path):
        def hook(mod, args):
            self.stack.append(path)
        return hook

    def _leave(self):
        def hook(mod, args, out):
            self.stack.pop()
        return hook

    def source_line(self):
        for frame in reversed(traceback.extract_stack()):
            if os.path.abspath(frame.filename) == self.user_file:
                return f"{frame.filename}:{frame.lineno}: {frame.line}"
        return None

    def remove(self):
        for h in self.handles:
            h.remove()


def trace(module, aliases, user_file, batch, seq):
    """The ATen graph of module(tokens, targets) at [batch, seq], parameters as placeholders."""
    recorder = _Recorder(module, user_file)

    class Tracer(proxy_tensor.PythonKeyTracer):
        def create_node(self, *args, **kwargs):
            node = super().create_node(*args, **kwargs)
            node.meta["module_path"] = recorder.stack[-1]
            node.meta["source"] = recorder.source_line()
            return node

    def call(tokens, targets, *params):
        saved = []
        for (_, _, holders), p in zip(aliases, params):
            for owner, attr in holders:
                saved.append((owner, attr, owner._parameters[attr]))
                owner._parameters[attr] = p
        try:
            return module(tokens, targets)
        finally:
            for owner, attr, p in reversed(saved):
                owner._parameters[attr] = p

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 2, (batch, seq), generator=gen)
    targets = torch.randint(0, 2, (batch, seq), generator=gen)
    params = [p.detach().clone() for _, p, _ in aliases]
    original = proxy_tensor.PythonKeyTracer
    proxy_tensor.PythonKeyTracer = Tracer
    try:
        gm = proxy_tensor.make_fx(call)(tokens, targets, *params)
    except ExportError:
        raise
    except Exception as e:
        where = ""
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            if os.path.abspath(frame.filename) == user_file:
                where = f" (at {frame.filename}:{frame.lineno}: {frame.line})"
                break
        raise ExportError(f"tracing forward(tokens, targets) at [{batch}, {seq}] failed{where}: "
                          f"{type(e).__name__}: {e}") from e
    finally:
        proxy_tensor.PythonKeyTracer = original
        recorder.remove()
    return gm, [tokens, targets] + params


# ---------------------------------------------------------------------------------------------
# Lowering ATen nodes to sluice instructions

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


class Lowering:
    """Turns one traced graph into program text. unit_of(node) names the unit of a node."""

    def __init__(self, gm, example_inputs, param_names, blocks, buffers):
        self.gm = gm
        self.buffers = buffers  # id(tensor) -> the module's name for a buffer
        self.from_buffer = {}   # fx node -> whether its value derives from a buffer
        self.constants = {}     # name -> tensor: the buffers the program reads (`const`)
        self.const_decls = []
        self.materialized = {}  # (fx node, unit) -> what lowering the node there gave
        self.inputs = example_inputs
        self.param_names = param_names
        self.blocks = blocks
        self.env = {}       # fx node -> Val | Transposed | Const | tuple of those | None
        self.concrete = {}  # fx node -> the tensor it computed at the traced sizes
        self.lines = []     # (unit, text)
        self.used_names = set()
        self.node = None
        self.unit = "embed"
        self.closed = set()
        self.counter = 0
        self.materializing = None  # the unit a buffer-derived node is being lowered in
        self.node_names = {}       # (fx node, materializing) -> the name of its first value
        self.stem_counts = {}      # name stem -> how many values took it

    # -- errors and names
    def fail(self, message):
        n = self.node
        where = []
        if n is not None:
            if n.meta.get("module_path"):
                where.append(f"in module '{n.meta['module_path']}'")
            if n.meta.get("source"):
                where.append(f"at {n.meta['source']}")
        raise ExportError(message + (" (" + ", ".join(where) + ")" if where else ""))

    def fresh(self, hint):
        """A new value name: the node's op under its module path (`layers.0.attention.slice`,
        then `..._1` for the next node of that op there), then NAME.HINT for the further
        instructions one node needs. Names count only what is emitted, never fx's node numbers, so
        traces that fold different nodes (a slice of a whole buffer) still name alike."""
        node = self.node
        if node is not None and node.target == aten.nll_loss_forward.default:
            name = "loss"
        else:
            key = (node, self.materializing)
            if key in self.node_names:
                name = f"{self.node_names[key]}.{hint}"
            else:
                base = re.sub(r"_\d+$", "", node.name) if node is not None else hint
                path = node.meta.get("module_path", "") if node is not None else ""
                prefix = self.materializing if self.materializing is not None else path
                stem = f"{prefix}.{base}" if prefix else base
                k = self.stem_counts.get(stem, 0)
                name = stem if k == 0 else f"{stem}_{k}"
                while name in self.used_names:
                    k += 1
                    name = f"{stem}_{k}"
                self.stem_counts[stem] = k + 1
                self.node_names[key] = name
                self.used_names.add(name)
                return name
        base = name
        while name in self.used_names:
            self.counter += 1
            name = f"{base}_{self.counter}"
        self.used_names.add(name)
        return name

    def emit(self, op, args, shape, dtype="f32", attrs=None, hint=None):
        out = Val(self.fresh(hint or op), shape, dtype)
        self.emit_multi(op, args, [out], attrs)
        return out

    def emit_multi(self, op, args, outs, attrs=None):
        text = ", ".join(f"%{o.name}: {fmt_type(o.dtype, o.shape)}" for o in outs)
        text += f" = {op}(" + ", ".join(f"%{a.name}" for a in args) + ")"
        if attrs:
            text += " {" + ", ".join(f"{k} = {fmt_attr(v)}" for k, v in sorted(attrs.items())) + "}"
        self.lines.append((self.unit, text))

    # -- operands
    def val(self, x):
        """x as a materialised Val (a constant only when it is a uniform tensor)."""
        if isinstance(x, Val):
            return x
        if isinstance(x, Transposed):
            r = len(x.val.shape)
            return self.emit("transpose", [x.val], x.shape, x.dtype, {"dim0": r - 2, "dim1": r - 1})
        if isinstance(x, Const):
            t = x.tensor
            if t.numel() > 0 and bool((t == t.reshape(-1)[0]).all()) and t.dtype in DTYPES:
                value = t.reshape(-1)[0].item()
                return self.emit("full", [], list(t.shape), DTYPES[t.dtype],
                                 {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                                  "value": float(value)})
            if x.origin is not None and self.from_buffer.get(x.origin):
                return self.val(self.materialize(x.origin))
            self.fail(f"a constant tensor of shape {list(t.shape)} that is not uniform and comes "
                      f"from no buffer is read by {self.node.target}: register it as a buffer "
                      f"(module.register_buffer), which becomes a program constant, or compute "
                      f"it from the inputs")
        self.fail(f"unexpected operand {x!r} of {self.node.target}")

    def materialize(self, node):
        """Lowers the buffer-derived node `node` for real in the current unit (once per unit, so
        that each pipeline stage reads the buffer itself and no slice of it crosses a cut); a
        buffer itself becomes a program constant, `const %NAME: T = loaded`."""
        key = (node, self.unit)
        if key in self.materialized:
            return self.materialized[key]
        if node.op == "get_attr":
            t = self.concrete[node]
            name = self.buffers[id(getattr(self.gm, node.target))]
            if t.dtype != torch.float32:
                self.fail(f"buffer {name} is {t.dtype}: sluice constants read as tensors are f32")
            if name not in self.constants:
                self.constants[name] = t
                self.const_decls.append(f"const %{name}: {fmt_type('f32', t.shape)} = loaded")
                self.used_names.add(name)
            return Val(name, t.shape, "f32")
        saved = self.node, self.materializing
        self.node, self.materializing = node, self.unit
        try:
            out = self.lower(node, fold=False)
        finally:
            self.node, self.materializing = saved
        self.materialized[key] = out
        return out

    def is_const(self, x):
        return isinstance(x, Const)

    def scalar_of(self, x):
        """A Python number, or a Const holding one value; None otherwise."""
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return float(x)
        if isinstance(x, Const) and x.tensor.numel() == 1:
            return float(x.tensor.reshape(-1)[0].item())
        return None

    def shape_of(self, node):
        return list(self.concrete[node].shape)

    # -- units
    def unit_for(self, node):
        path = node.meta.get("module_path", "")
        for b in self.blocks:
            if path == b or path.startswith(b + "."):
                return b
        return None

    def enter_unit(self, node):
        b = self.unit_for(node)
        if b is not None and b != self.unit and b not in self.closed:
            self.closed.add(self.unit)
            self.unit = b

    # -- the graph
    def run(self):
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != 2 + len(self.param_names):
            raise ExportError("forward must take exactly (tokens, targets)")
        decls = []
        for i, (n, t) in enumerate(zip(placeholders, self.inputs)):
            self.concrete[n] = t
            if i < 2:
                name = ["tokens", "targets"][i]
                array = ["tokens", "next_tokens"][i]
                self.env[n] = Val(name, t.shape, "i64")
                decls.append(f"input %{name}: {fmt_type('i64', t.shape)} = {array}")
            else:
                name = self.param_names[i - 2]
                if t.dtype != torch.float32:
                    raise ExportError(f"parameter {name} is {t.dtype}: sluice trains f32 parameters")
                self.env[n] = Val(name, t.shape, "f32")
                decls.append(f"param %{name}: {fmt_type('f32', t.shape)} = loaded")
            self.used_names.add(self.env[n].name)
        nodes = list(self.gm.graph.nodes)
        fused, skipped = find_rms_norms(nodes)
        last_block = max((i for i, n in enumerate(nodes) if self.unit_for(n) is not None),
                         default=-1)
        loss = None
        for index, node in enumerate(nodes):
            self.node = node
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                t = getattr(self.gm, node.target)
                self.concrete[node] = t
                self.env[node] = Const(t.detach().clone(), node)
                self.from_buffer[node] = id(t) in self.buffers
                continue
            if node.op == "output":
                (result,) = node.args
                if isinstance(result, (list, tuple)):
                    self.fail("forward must return one scalar loss, not a tuple")
                loss = self.env[result]
                shape = self.concrete[result].shape
                if len(shape) != 0 or self.concrete[result].dtype != torch.float32:
                    self.fail(f"forward must return the mean loss, a float scalar; it returns "
                              f"{self.concrete[result].dtype} of shape {list(shape)}")
                continue
            # evaluate concretely (the traced values), then lower
            args = fx.node.map_arg(node.args, lambda a: self.concrete[a])
            kwargs = fx.node.map_arg(node.kwargs, lambda a: self.concrete[a])
            self.concrete[node] = node.target(*args, **kwargs)
            self.from_buffer[node] = any(self.from_buffer.get(a, False)
                                         for a in node.all_input_nodes)
            if self.unit_for(node) is not None:
                self.enter_unit(node)
            elif index > last_block >= 0 and self.unit != "head":
                self.closed.add(self.unit)
                self.unit = "head"
            if node in skipped:
                self.env[node] = None  # inside an RMS norm that `fused` emits whole
            elif node in fused:
                x, w, eps = fused[node]
                x, w = self.val(self.env[x]), self.env[w]
                if not isinstance(w, Val) or w.shape != x.shape[-1:]:
                    self.fail("an RMS norm whose weight is not a parameter of the last axis")
                self.env[node] = self.emit("rms_norm", [x, w], list(self.concrete[node].shape),
                                           "f32", {"eps": float(eps)})
            else:
                self.env[node] = self.lower(node) if node.users else None
        if not isinstance(loss, Val):
            self.fail("the loss does not depend on the inputs and parameters")
        body = []
        current = None
        for unit, text in self.lines:
            if unit != current:
                if current is not None:
                    body.append("  }")
                body.append(f"  unit {unit} {{")
                current = unit
            body.append("    " + text)
        if current is not None:
            body.append("  }")
        units = list(dict.fromkeys(u for u, _ in self.lines))
        decls += self.const_decls
        out = ["program model {"] + ["  " + d for d in decls] + body + [f"  output %{loss.name}",
                                                                        "}"]
        return "\n".join(out) + "\n", units

    def lower(self, node, fold=True):
        target = node.target
        args = fx.node.map_arg(node.args, lambda a: self.env[a])
        kwargs = fx.node.map_arg(node.kwargs, lambda a: self.env[a])
        out_shape = list(self.concrete[node].shape) if isinstance(self.concrete[node],
                                                                  torch.Tensor) else None
        flat = [a for a in node.all_input_nodes]
        if fold and all(isinstance(self.env[a], Const) for a in flat):
            if isinstance(self.concrete[node], torch.Tensor):
                return Const(self.concrete[node].detach().clone(), node)
            if isinstance(self.concrete[node], (tuple, list)):
                return tuple(Const(t) if isinstance(t, torch.Tensor) else None
                             for t in self.concrete[node])
        if target is getattr(__import__("operator"), "getitem"):
            src, i = args
            if src[i] is None:
                self.fail(f"output {i} of {node.args[0].target} is used; sluice computes only "
                          f"output 0 of it")
            return src[i]
        handler = LOWERINGS.get(target)
        if handler is None:
            self.fail(f"unsupported ATen op {target}: sluice has no mapping for it "
                      f"(docs/torch-export.md lists the supported ops)")
        return handler(self, node, args, kwargs, out_shape)


def find_rms_norms(nodes):
    """RMS norms written out, `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight`,
    which PyTorch traces as pow, mean, add, rsqrt, mul, mul: {the last mul: (x, weight, eps)}
    and the set of the nodes before it, each read only by the next (one rms_norm replaces them)."""
    def call(n, *targets):
        return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets

    def only_user(n, user):
        return list(n.users) == [user]

    fused, skipped = {}, set()
    for out in nodes:
        if not call(out, aten.mul.Tensor):
            continue
        for inner, weight in (out.args, out.args[::-1]):
            if not call(inner, aten.mul.Tensor) or not only_user(inner, out):
                continue
            for x, rsqrt in (inner.args, inner.args[::-1]):
                if not call(rsqrt, aten.rsqrt.default) or not only_user(rsqrt, inner):
                    continue
                add = rsqrt.args[0]
                if not call(add, aten.add.Tensor, aten.add.Scalar) or not only_user(add, rsqrt):
                    continue
                mean, eps = add.args[0], add.args[1]
                if not isinstance(eps, (int, float)) or eps <= 0:
                    continue
                if not call(mean, aten.mean.dim) or not only_user(mean, add):
                    continue
                sq = mean.args[0]
                dims, keep = mean.args[1], (mean.args[2] if len(mean.args) > 2 else False)
                rank = len(sq.meta["val"].shape) if "val" in sq.meta else None
                if not keep or len(dims) != 1 or dims[0] not in (-1, (rank or 0) - 1):
                    continue
                if not call(sq, aten.pow.Tensor_Scalar) or sq.args[1] != 2 or sq.args[0] is not x:
                    continue
                if not only_user(sq, mean):
                    continue
                fused[out] = (x, weight, eps)
                skipped.update({sq, mean, add, rsqrt, inner})
                break
            if out in fused:
                break
    return fused, skipped


# Handlers: (lowering, node, args, kwargs, out_shape) -> value

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
    x, mask, value = args[0], args[1], args[2]
    v = L.scalar_of(value)
    if isinstance(mask, Const) and v is not None and _causal_mask_value(mask.tensor, False):
        if list(mask.tensor.shape[-2:]) != shape[-2:]:
            L.fail("masked_fill with a causal mask of another size than the scores")
        return L.emit("causal_mask", [L.val(x)], shape, "f32", {"value": v})
    L.fail("masked_fill is supported with a constant causal mask only (entries above the diagonal "
           "filled); other masks are not")


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


def _sigmoid_of(L, x, shape):
    # sigmoid(x) = 0.5 + 0.5·tanh(x/2): no overflow for large |x|, unlike 1 / (1 + e^-x)
    h = L.emit("scale", [x], shape, "f32", {"factor": 0.5}, hint="half")
    t = L.emit("tanh", [h], shape, "f32")
    t = L.emit("scale", [t], shape, "f32", {"factor": 0.5}, hint="half_tanh")
    half = L.emit("full", [], [], "f32", {"dtype": "f32", "shape": [], "value": 0.5}, hint="half")
    return L.emit("add", [t, half], shape, "f32", hint="sigmoid")


def _sigmoid(L, node, args, kwargs, shape):
    return _sigmoid_of(L, L.val(args[0]), shape)


def _silu(L, node, args, kwargs, shape):
    return L.emit("silu", [L.val(args[0])], shape, "f32")


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
    if len(normalized) != 1 or w is None or b is None:
        L.fail("layer_norm over more than the last axis, or without weight and bias, is not "
               "supported")
    shape = list(L.concrete[node][0].shape)
    y = L.emit("layer_norm", [L.val(x), L.val(w), L.val(b)], shape, "f32", {"eps": float(eps)})
    return (y, None, None)


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
    if weight is not None or reduction != 1:
        L.fail("cross-entropy with class weights or a reduction other than 'mean'")
    if ignore not in (-1, -100):
        L.fail(f"cross-entropy with ignore_index={ignore}: sluice ignores targets of -1 "
               f"(write ignore_index=-1)")
    loss = L.emit("cross_entropy", [logp[1], L.val(targets)], [], "f32", hint="loss")
    return (loss, None)


def _embedding(L, node, args, kwargs, shape):
    table, ids = args[0], args[1]
    if isinstance(ids, Const):
        t = ids.tensor
        n = t.shape[-1] if t.dim() > 0 else 0
        if t.dim() == 1 and bool((t == torch.arange(n)).all()):
            table = L.val(table)
            return L.emit("slice", [table], shape, "f32", {"axis": 0, "start": 0, "end": n})
        L.fail("embedding of constant ids other than arange(0, n)")
    return L.emit("embedding", [L.val(ids), L.val(table)], shape, "f32")


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
    L.emit_multi("split", [x], outs, {"axis": dim, "sizes": sizes})
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
    x, p, train = args[0], args[1], args[2]
    if train and p:
        L.fail(f"dropout with p={p} in training mode: sluice has no dropout; use p=0 or "
               f"call module.eval() in the factory")
    return (x, None)


def _repeat_axis(L, x, dim, repeats, shape):
    """x with each entry along `dim` repeated `repeats` times in place (repeat_interleave):
    a new axis of 1 after dim, broadcast to `repeats`, merged back into dim."""
    x = L.val(x)
    if repeats == 1:
        return x
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
    aten.addmm.default: _addmm,
    aten.add.Tensor: _binary("add"), aten.sub.Tensor: _binary("sub"),
    aten.mul.Tensor: _binary("mul"), aten.div.Tensor: _binary("div"),
    aten.add.Scalar: _binary("add"), aten.mul.Scalar: _binary("mul"),
    aten.masked_fill.Scalar: _masked_fill,
    aten.neg.default: _unary("neg"), aten.exp.default: _unary("exp"),
    aten.log.default: _unary("log"), aten.sqrt.default: _unary("sqrt"),
    aten.tanh.default: _unary("tanh"), aten.relu.default: _unary("relu"),
    aten.gelu.default: _gelu, aten.silu.default: _silu, aten.sigmoid.default: _sigmoid,
    aten.rsqrt.default: _rsqrt, aten.pow.Tensor_Scalar: _pow,
    aten.mean.dim: _reduce("mean"), aten.sum.dim_IntList: _reduce("sum"),
    aten.native_layer_norm.default: _layer_norm,
    aten._softmax.default: _softmax, aten._log_softmax.default: _log_softmax,
    aten.nll_loss_forward.default: _nll_loss,
    aten.embedding.default: _embedding,
    aten.slice.Tensor: _slice, aten.select.int: _select,
    aten.split.Tensor: _split, aten.split_with_sizes.default: _split,
    aten.cat.default: _cat,
    aten.unsqueeze.default: _unsqueeze_squeeze, aten.squeeze.dim: _unsqueeze_squeeze,
    aten.squeeze.default: _unsqueeze_squeeze,
    aten.native_dropout.default: _dropout,
    aten.repeat_interleave.self_int: _repeat_interleave,
    aten.index_select.default: _index_select,
}


# ---------------------------------------------------------------------------------------------
# Sizes

_INT = re.compile(r"(?<![\w.+\-])-?\d+(?![\w.])")


def size_product(a, b, sizes_a, sizes_b):
    """The product of B, T (each to the power 0..2) and a factor giving a at sizes_a and b at
    sizes_b; None when none or more than one does."""
    found = set()
    for pb in range(3):
        for pt in range(3):
            if pb == pt == 0:
                continue
            ma = sizes_a[0] ** pb * sizes_a[1] ** pt
            mb = sizes_b[0] ** pb * sizes_b[1] ** pt
            if a % ma or b % mb or a // ma != b // mb or a // ma <= 0:
                continue
            f = a // ma
            terms = ([] if f == 1 else [str(f)]) + ["B"] * pb + ["T"] * pt
            found.add("*".join(terms))
    return found.pop() if len(found) == 1 else None


def generalise(text_a, sizes_a, text_b, sizes_b):
    pieces_a, pieces_b = _INT.split(text_a), _INT.split(text_b)
    ints_a, ints_b = _INT.findall(text_a), _INT.findall(text_b)
    if pieces_a != pieces_b:
        for line_no, (la, lb) in enumerate(zip(text_a.splitlines(), text_b.splitlines()), 1):
            if _INT.split(la) != _INT.split(lb):
                raise ExportError(
                    f"the program differs between [{sizes_a[0]}, {sizes_a[1]}] and "
                    f"[{sizes_b[0]}, {sizes_b[1]}] in more than sizes (data-dependent control "
                    f"flow?), line {line_no}:\n  {la.strip()}\n  {lb.strip()}")
        raise ExportError("the program differs between sizes in its number of lines "
                          "(data-dependent control flow?)")
    out = [pieces_a[0]]
    for ia, ib, piece in zip(ints_a, ints_b, pieces_a[1:]):
        if ia != ib:
            expr = size_product(int(ia), int(ib), sizes_a, sizes_b)
            if expr is None:
                line = text_a[:text_a.find(piece)].count("\n") + 1
                raise AmbiguousSizes(f"line {line}: {ia} becomes {ib} at other sizes, which no single product of "
                                  f"B and T gives (try another --batch)")
            ia = expr
        out.append(ia)
        out.append(piece)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Output

def write_safetensors(path, tensors):
    """A safetensors file: u64 header length, JSON header, raw little-endian data."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        code = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}[t.dtype]
        raw = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def check_out(out):
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out} is an existing file: give a new or empty folder")
    if os.path.isdir(out) and os.listdir(out):
        raise ExportError(f"--out {out} is a folder that holds other files: give a new or empty "
                          f"folder")


def second_sizes(batch, seq):
    """Sizes for the second trace: smaller T (a position table may cap it), another B."""
    for b2, t2 in ((batch + 1, seq - 1), (batch + 2, seq - 2), (2 * batch + 1, seq - 3)):
        if t2 >= 1 and b2 * seq != batch * t2:
            yield b2, t2


def export(spec, batch, seq, out):
    if batch < 1 or seq < 2:
        raise ExportError("--batch must be at least 1 and --seq at least 2")
    check_out(out)
    module, user_file = load_module(spec)
    aliases = parameter_aliases(module)
    names = [n for n, _, _ in aliases]
    blocks = block_paths(module)
    buffers = {id(b): n for n, b in module.named_buffers()}
    texts = []
    last_error = None
    gm, inputs = trace(module, aliases, user_file, batch, seq)
    lowering = Lowering(gm, inputs, names, blocks, buffers)
    text, units = lowering.run()
    for b2, t2 in second_sizes(batch, seq):
        gm2, inputs2 = trace(module, aliases, user_file, b2, t2)
        text2, _ = Lowering(gm2, inputs2, names, blocks, buffers).run()
        try:
            program = generalise(text, (batch, seq), text2, (b2, t2))
            break
        except AmbiguousSizes as e:
            last_error = e
    else:
        raise last_error
    program = (f"# exported by tools/torch_export.py from {spec} (traced at batch {batch}, "
               f"sequence {seq})\n" + program)

    parent = os.path.dirname(os.path.abspath(out)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".torch_export.", dir=parent)
    try:
        with open(os.path.join(tmp, "model.sluice"), "w") as f:
            f.write(program)
        tensors = {n: p for n, p, _ in aliases}
        tensors.update(lowering.constants)
        write_safetensors(os.path.join(tmp, "init.safetensors"), tensors)
        if os.path.isdir(out):
            os.rmdir(out)  # empty, checked above
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tied = [(n, len(hs)) for n, _, hs in aliases if len(hs) > 1]
    return units, tied, len(names), sum(p.numel() for _, p, _ in aliases), list(lowering.constants)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="torch_export.py",
        description="Export a PyTorch module as a sluice training program (docs/torch-export.md)")
    parser.add_argument("spec", metavar="FILE.py:FACTORY")
    parser.add_argument("--batch", type=int, required=True, help="batch of the example trace")
    parser.add_argument("--seq", type=int, required=True, help="longest sequence T")
    parser.add_argument("--out", required=True, help="new or empty folder to write")
    a = parser.parse_args(argv)
    try:
        units, tied, count, numel, constants = export(a.spec, a.batch, a.seq, a.out)
    except ExportError as e:
        print(f"torch_export: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {os.path.join(a.out, 'model.sluice')} and {os.path.join(a.out, 'init.safetensors')}"
          f" ({count} parameters, {numel} values)")
    print(f"units: {', '.join(units)}")
    if constants:
        print(f"constants (buffers, never trained): {', '.join(constants)}")
    for n, k in tied:
        print(f"tied: {n} is shared by {k} modules (one parameter)")
    print(f"train it: sluice train --program {os.path.join(a.out, 'model.sluice')} "
          f"--init-from {os.path.join(a.out, 'init.safetensors')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
