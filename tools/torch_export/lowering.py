"""One traced ATen graph to program text (Lowering), and the patterns it fuses: RMS norms,
causal attention, SwiGLU gates."""
import operator
import re

import torch
import torch.fx as fx

from .errors import ExportError
from .ops import LOWERINGS, _causal_mask_value, cross_entropy, repeat_copy
from .values import DTYPES, Const, Repeated, Transposed, Val, fmt_attr, fmt_type

aten = torch.ops.aten


class Lowering:
    """Turns one traced graph into program text. unit_of(node) names the unit of a node."""

    def __init__(self, gm, example_inputs, param_names, blocks, buffers,
                 data_inputs=(("tokens", "tokens"), ("targets", "next_tokens"))):
        self.gm = gm
        # (program input name, data array it binds), one per forward argument, in order
        self.data_inputs = list(data_inputs)
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
        self.random_key = None     # the input %random_key, once a dropout reads it
        self.dropouts = 0          # dropouts emitted: the next one's stream

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
        text += (" = " if outs else "") + f"{op}(" + ", ".join(f"%{a.name}" for a in args) + ")"
        if attrs:
            text += " {" + ", ".join(f"{k} = {fmt_attr(v)}" for k, v in sorted(attrs.items())) + "}"
        self.lines.append((self.unit, text))

    # -- operands
    def val(self, x):
        """x as a materialised Val (a constant only when it is a uniform tensor)."""
        if isinstance(x, Val):
            return x
        if isinstance(x, Repeated):
            if x.materialized is None:
                x.materialized = repeat_copy(self, x)
            return x.materialized
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

    def running_buffer(self, x):
        """The buffer `x` (a Const of a module's buffer, batch norm's running mean or variance)
        declared as `buffer %NAME: T = loaded`: state the program updates in place (its running
        statistics), kept by checkpoints, never trained."""
        node = x.origin if isinstance(x, Const) else None
        if node is None or node.op != "get_attr" or not self.from_buffer.get(node):
            self.fail("batch norm's running statistics must be the module's own buffers")
        t = self.concrete[node]
        name = self.buffers[id(getattr(self.gm, node.target))]
        if t.dtype != torch.float32:
            self.fail(f"buffer {name} is {t.dtype}: sluice's running statistics are f32")
        if name not in self.constants:
            self.constants[name] = t
            self.const_decls.append(f"buffer %{name}: {fmt_type('f32', t.shape)} = loaded")
            self.used_names.add(name)
        return Val(name, t.shape, "f32")

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
        count = len(self.data_inputs)
        if len(placeholders) != count + len(self.param_names):
            raise ExportError(f"forward must take exactly "
                              f"({', '.join(n for n, _ in self.data_inputs)})")
        decls = []
        for i, (n, t) in enumerate(zip(placeholders, self.inputs)):
            self.concrete[n] = t
            if i < count:
                name, array = self.data_inputs[i]
                dtype = DTYPES[t.dtype]
                self.env[n] = Val(name, t.shape, dtype)
                decls.append(f"input %{name}: {fmt_type(dtype, t.shape)} = {array}")
            else:
                name = self.param_names[i - count]
                if t.dtype != torch.float32:
                    raise ExportError(f"parameter {name} is {t.dtype}: sluice trains f32 parameters")
                self.env[n] = Val(name, t.shape, "f32")
                decls.append(f"param %{name}: {fmt_type('f32', t.shape)} = loaded")
            self.used_names.add(self.env[n].name)
        nodes = list(self.gm.graph.nodes)
        fused, skipped = find_rms_norms(nodes)
        attentions, attention_parts = find_attentions(nodes)
        skipped |= attention_parts
        swiglus = find_swiglus(nodes)
        skipped |= {silu for _, _, silu in swiglus.values()}
        dropouts, dropout_parts = find_dropouts(nodes)
        skipped |= dropout_parts
        smoothed = find_smoothed_cross_entropies(nodes)
        for _, _, _, _, parts in smoothed.values():
            skipped |= parts
        order = {n: i for i, n in enumerate(nodes)}
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
            elif node in swiglus:
                self.env[node] = self.swiglu(node, *swiglus[node])
            elif node in dropouts:
                x, p = dropouts[node]
                self.env[node] = self.dropout(self.val(self.env[x]), p)
            elif node in smoothed:
                self.env[node] = self.smoothed_cross_entropy(node, *smoothed[node][:4])
            elif node in attentions:
                self.env[node] = self.attention(node, attentions[node], order)
            elif node in fused:
                x, w, eps = fused[node]
                x, w = self.val(self.env[x]), self.env[w]
                if not isinstance(w, Val) or w.shape != x.shape[-1:]:
                    self.fail("an RMS norm whose weight is not a parameter of the last axis")
                self.env[node] = self.emit("rms_norm", [x, w], list(self.concrete[node].shape),
                                           "f32", {"eps": float(eps)})
            elif not node.users and self.mutates_a_value(node):
                if node.target == aten.embedding_renorm_.default:
                    self.fail("nn.Embedding with max_norm renormalises rows of its weight in place "
                              "in forward (aten.embedding_renorm_); sluice's embedding does not: "
                              "drop max_norm")
                self.fail(f"in-place op {node.target} changes a value that depends on the inputs "
                          f"or parameters, and nothing reads its result: a program computes new "
                          f"values only, so the change would be lost; write it out of place")
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
        if self.random_key is not None:
            decls.insert(count, f"input %{self.random_key.name}: "
                                f"{fmt_type('i64', self.random_key.shape)} = random_key")
        decls += self.const_decls
        out = ["program model {"] + ["  " + d for d in decls] + body + [f"  output %{loss.name}",
                                                                        "}"]
        return "\n".join(out) + "\n", units

    def attention(self, node, found, order):
        """A written-out attention as one fused op: causal_attention for a constant causal mask,
        attention without a mask, attention_key_bias for a key-padding mask (one value per key of
        each sequence, shared by the heads and the queries: [B, 1, 1, T] against scores
        [B, H, T, T], or [B·H, 1, T] against nn.MultiheadAttention's [B·H, T, T]). Any other mask,
        or operands that do not fit, and its nodes are lowered one by one after all."""
        q, k, v, scale, mask, additive, parts = found
        qv, kv, vv = (self.env.get(n) for n in (q, k, v))
        # grouped-query keys and values, repeated along the heads (axis -3): read in place
        if (isinstance(kv, Repeated) and isinstance(vv, Repeated) and isinstance(qv, Val)
                and len(qv.shape) >= 3 and kv.dim == vv.dim == len(qv.shape) - 3
                and kv.repeats == vv.repeats and kv.shape == vv.shape == qv.shape
                and kv.val.shape == vv.val.shape):
            kv, vv = kv.val, vv.val
        op = None
        if (all(isinstance(x, Val) for x in (qv, kv, vv)) and len(qv.shape) >= 3
                and kv.shape == vv.shape
                and (qv.shape == kv.shape or qv.shape[:-3] + qv.shape[-2:]
                     == kv.shape[:-3] + kv.shape[-2:])):
            m = self.env.get(mask) if mask is not None else None
            if mask is None:
                op = "attention"
            elif isinstance(m, Const):
                value = _causal_mask_value(m.tensor, additive) if additive else (
                    float("-inf") if _causal_mask_value(m.tensor, False) else None)
                if value == float("-inf") and list(m.tensor.shape[-2:]) == [qv.shape[-2]] * 2:
                    op = "causal_attention"
            elif isinstance(m, Val) and _key_bias_rows(list(m.shape), qv.shape) is not None:
                op = "attention_key_bias"
        if op is None:
            for n in sorted(parts, key=order.get):
                self.node = n
                self.env[n] = self.lower(n)
            self.node = node
            return self.lower(node)
        inputs = [qv, kv, vv]
        if op == "attention_key_bias":
            bias = self.key_bias(m, additive, qv.shape)
            if len(qv.shape) == 3:  # [B·H, T, D]: each entry a sequence of one head
                inputs = [self.emit("reshape", [x], [x.shape[0], 1] + x.shape[1:], "f32",
                                    {"shape": [x.shape[0], 1] + x.shape[1:]}, hint="heads")
                          for x in inputs]
            inputs.append(bias)
        shape = inputs[0].shape
        y = Val(self.fresh("attention"), shape, "f32")
        lse = Val(self.fresh("lse"), shape[:-1], "f32")
        self.emit_multi(op, inputs, [y, lse], {"scale": float(scale)})
        return self.emit("reshape", [y], list(self.concrete[node].shape), "f32",
                         {"shape": list(self.concrete[node].shape)})

    def key_bias(self, m, additive, q_shape):
        """attention_key_bias's key_bias [..., T] for q [..., H, T, D] from a key-padding mask
        (_key_bias_rows): the mask's values (added) or -inf where it is true (masked_fill), as
        one row per sequence, broadcast where the mask is shared by every sequence."""
        rows = _sequence_axes(q_shape) + [q_shape[-2]]
        mask_rows = _key_bias_rows(list(m.shape), q_shape)
        bias = self.emit("reshape", [m], mask_rows, "f32", {"shape": mask_rows}, hint="key_bias")
        if not additive:  # masked_fill(mask, -inf): -inf where the mask holds, 0 elsewhere
            hidden = self.emit("full", [], [], "f32",
                               {"dtype": "f32", "shape": [], "value": float("-inf")})
            kept = self.emit("full", [], [], "f32", {"dtype": "f32", "shape": [], "value": 0.0})
            bias = self.emit("where", [bias, hidden, kept], mask_rows, "f32", hint="key_bias")
        if mask_rows != rows:
            bias = self.emit("broadcast_to", [bias], rows, "f32", {"shape": rows}, hint="key_bias")
        return bias

    def dropout(self, x, p):
        """x through dropout with probability p in training: `dropout(x, %random_key) {p, stream}`,
        the mask drawn by sluice from the examples' random keys (`random_key` i64[B]) and the
        dropout's stream (its place among the program's dropouts), never stored."""
        if self.random_key is None:
            if "random_key" in self.used_names:
                self.fail("a forward argument is named random_key, the input a program's "
                          "dropouts read their key from: rename it")
            # one key per example: the batch is the leading axis of every forward argument
            batch = self.inputs[0].shape[0]
            self.random_key = Val("random_key", [batch], "i64")
            self.used_names.add("random_key")
        stream = self.dropouts
        self.dropouts += 1
        return self.emit("dropout", [x, self.random_key], x.shape, x.dtype,
                         {"p": float(f"{p:.12g}"), "stream": stream})

    def swiglu(self, node, a, b, silu):
        """silu(a) * b as one swiglu (its backward recomputes silu from a, so the forward keeps a
        and b only); when the operands are not two values of one shape (broadcasting, a
        constant), silu and mul are lowered one by one after all."""
        av, bv = self.env.get(a), self.env.get(b)
        shape = list(self.concrete[node].shape)
        if (isinstance(av, Val) and isinstance(bv, Val) and av.shape == bv.shape == shape
                and av.dtype == bv.dtype == "f32"):
            return self.emit("swiglu", [av, bv], shape, "f32")
        self.node = silu
        self.env[silu] = self.lower(silu)
        self.node = node
        return self.lower(node)

    def smoothed_cross_entropy(self, node, logp, nll, keep, spread):
        """F.cross_entropy(..., label_smoothing=ε) as one cross_entropy {label_smoothing = ε}:
        keep = 1 − ε and spread = ε / C, C the classes."""
        classes = self.concrete[logp].shape[-1]
        eps = float(spread) * classes
        if abs(float(keep) - (1 - eps)) > 1e-6:
            self.fail(f"a cross-entropy mixed with its smoothing term as {keep} and {spread}, "
                      f"which no label_smoothing gives")
        self.node = nll
        x = logp.args[0]
        if logp.args[1] % len(self.concrete[logp].shape) != len(self.concrete[logp].shape) - 1:
            self.fail("log_softmax over an axis other than the last")
        _, targets, weight, reduction, ignore = nll.args
        loss = cross_entropy(self, self.val(self.env[x]), self.env[targets], weight, reduction,
                             ignore, eps)
        self.node = node
        return loss

    def mutates_a_value(self, node):
        """Whether `node` is an in-place ATen op on a value that is not a folded constant (a
        constant's in-place change is folded with it, as MultiheadAttention's mask)."""
        schema = getattr(node.target, "_schema", None)
        if schema is None or not schema.is_mutable:
            return False
        return any(not isinstance(self.env.get(a), Const) for a in node.all_input_nodes)

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


def _call(n, *targets):
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def find_dropouts(nodes):
    """Dropout in training (nn.Dropout, F.dropout, MultiheadAttention's and
    TransformerEncoderLayer's), which PyTorch 1.13 traces as empty_like(x), bernoulli_(1 − p),
    div_(1 − p) and mul(x, mask): {the mul: (x, p)} and the set of the three nodes before it, each
    read by the next alone (one dropout replaces them: sluice draws the mask, never keeps it)."""
    found, skipped = {}, set()
    for empty in nodes:
        if not _call(empty, aten.empty_like.default) or len(empty.users) != 1:
            continue
        (bernoulli,) = empty.users
        if not _call(bernoulli, aten.bernoulli_.float) or len(bernoulli.users) != 1:
            continue
        keep = bernoulli.args[1]
        (div,) = bernoulli.users
        if (not _call(div, aten.div_.Scalar) or len(div.users) != 1 or div.args[0] is not bernoulli
                or div.args[1] != keep):
            continue
        (mul,) = div.users
        x = empty.args[0]
        if not _call(mul, aten.mul.Tensor) or set(mul.args) != {x, div}:
            continue
        found[mul] = (x, 1 - keep)
        skipped |= {empty, bernoulli, div}
    return found, skipped


def find_swiglus(nodes):
    """SwiGLU gates, `F.silu(a) * b` (Llama's MLP), which PyTorch traces as silu then mul:
    {the mul: (a, b, the silu)} where the silu is read by that mul alone (its value is then
    needed by nothing else, and one swiglu replaces both)."""
    def call(n, *targets):
        return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets

    found = {}
    for out in nodes:
        if not call(out, aten.mul.Tensor) or len(out.args) != 2:
            continue
        for silu, b in (out.args, out.args[::-1]):
            if (call(silu, aten.silu.default) and list(silu.users) == [out]
                    and isinstance(b, fx.Node) and b is not silu):
                found[out] = (silu.args[0], b, silu)
                break
    return found


def find_smoothed_cross_entropies(nodes):
    """Cross-entropies with label smoothing, which PyTorch 1.13 traces as the nll loss of the
    log-softmax times (1 − ε) plus ε / C times the (mean or summed) −Σ log-probabilities, their
    ignored rows zeroed (index_put_) or dropped (masked_select): {the final add: (log_softmax,
    nll_loss_forward, ε, the nodes it replaces)}. The log-softmax, the nll and the smoothing term
    are read by nothing else."""
    def call(n, *targets):
        return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets

    found = {}
    for add in nodes:
        if not call(add, aten.add.Tensor) or len(add.args) != 2:
            continue
        for main, smooth in (add.args, add.args[::-1]):
            if not (call(main, aten.mul.Scalar) and call(smooth, aten.mul.Scalar)):
                continue
            item = main.args[0]
            if not (call(item, operator.getitem) and item.args[1] == 0
                    and call(item.args[0], aten.nll_loss_forward.default)):
                continue
            nll = item.args[0]
            parts = {main, smooth, item, nll} | set(nll.users)
            x = smooth.args[0]
            if call(x, aten.mean.default):  # reduction "mean": the rows not ignored
                selected = x.args[0]
                if not call(selected, aten.masked_select.default):
                    continue
                parts |= {x, selected}
                if call(selected.args[1], aten.bitwise_not.default):
                    parts.add(selected.args[1])
                x = selected.args[0]
            elif call(x, aten.sum.default):  # reduction "sum"
                parts.add(x)
                x = x.args[0]
            else:
                continue
            if not call(x, aten.index_put_.default):
                continue
            parts.add(x)
            for index in x.args[1]:
                if call(index, aten.eq.Scalar):
                    parts.add(index)
            neg = x.args[0]
            if not call(neg, aten.neg.default):
                continue
            total = neg.args[0]
            if not call(total, aten.sum.dim_IntList):
                continue
            logp = total.args[0]
            if not (call(logp, aten._log_softmax.default) and nll.args[0] is logp
                    and set(logp.users) == {nll, total}):
                continue
            parts |= {neg, total, logp}
            found[add] = (logp, nll, main.args[1], smooth.args[1], parts)
            break
    return found


_VIEWS = None


def _views():
    global _VIEWS
    if _VIEWS is None:
        _VIEWS = {aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default,
                  aten.reshape.default, aten.expand.default, aten.clone.default,
                  aten.contiguous.default, aten.alias.default}
    return _VIEWS


def _key_bias_rows(mask, q):
    """For a mask of shape `mask` over the scores of q [..., H, T, D] (q[:-1] + [T], the mask
    broadcast to it) that holds one value per key of each sequence — 1 on the query axis and on
    the heads, T on the keys: the shape of its rows, q's axes before H (each that axis or 1) then
    T; None for any other mask. q [N, T, D] (nn.MultiheadAttention's N = B·H entries) is N
    sequences of one head."""
    t = q[-2]
    scores = list(q[:-1]) + [t]
    if not mask or len(mask) > len(scores) or mask[-1] != t:
        return None
    mask = [1] * (len(scores) - len(mask)) + list(mask)
    heads = len(q) >= 4
    if mask[-2] != 1 or heads and mask[-3] != 1:
        return None
    lead, mask_lead = (scores[:-3], mask[:-3]) if heads else (scores[:-2], mask[:-2])
    if any(m not in (1, n) for m, n in zip(mask_lead, lead)):
        return None
    return mask_lead + [t]


def _sequence_axes(q):
    """The axes of q [..., H, T, D] before H; of q [N, T, D], N (sequences of one head)."""
    return list(q[:-3]) if len(q) >= 4 else list(q[:-2])


def find_attentions(nodes):
    """Attention written out — softmax(q @ k.transpose(-2, -1) * scale [masked]) @ v, which
    PyTorch traces through views to [B·H, T, D] for its bmm's — as {the last bmm: (q, k, v, scale,
    mask node or None, whether the mask is added, the nodes in between)}. The scale multiplies or
    divides the scores, or q before its product (nn.MultiheadAttention); the mask is added to the
    scores (add, or baddbmm: nn.MultiheadAttention's attn_mask and key_padding_mask) or fills
    them with -inf where it is true (masked_fill); none is an encoder's attention over every key
    (ViT). What the mask is — a constant causal one, a key-padding one — is known only when
    lowering (Lowering.attention checks it)."""
    def call(n, *targets):
        return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets

    def through_views(n, parts):
        while call(n, *_views()) and len(n.users) == 1:
            parts.add(n)
            n = n.args[0]
        return n

    def scale_of(n):
        """The factor of x * c or x / c (c a nonzero number), as a multiplier; else None."""
        if not call(n, aten.mul.Tensor, aten.div.Tensor) or len(n.users) != 1:
            return None
        factor = n.args[1]
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor == 0:
            return None
        return float(factor) if n.target == aten.mul.Tensor else 1.0 / float(factor)

    found, all_parts = {}, set()
    for out in nodes:
        if not call(out, aten.bmm.default):
            continue
        parts = set()
        probs = through_views(out.args[0], parts)
        v = through_views(out.args[1], parts)
        if not call(probs, aten._softmax.default) or len(probs.users) != 1:
            continue
        parts.add(probs)
        scores, mask, additive = probs.args[0], None, True
        if call(scores, aten.add.Tensor) and len(scores.users) == 1:
            parts.add(scores)
            scores, mask = scores.args[0], scores.args[1]
        elif (call(scores, aten.masked_fill.Scalar) and len(scores.users) == 1
              and scores.args[2] == float("-inf")):
            parts.add(scores)
            scores, mask, additive = scores.args[0], scores.args[1], False
        elif (call(scores, aten.baddbmm.default) and len(scores.users) == 1
              and scores.kwargs.get("beta", 1) == 1 and scores.kwargs.get("alpha", 1) == 1):
            mask = scores.args[0]
        scale = scale_of(scores)
        if scale is not None:
            parts.add(scores)
            scores = through_views(scores.args[0], parts)
        if call(scores, aten.baddbmm.default) and mask is not None and mask is scores.args[0]:
            a, b = scores.args[1], scores.args[2]
        elif call(scores, aten.bmm.default):
            a, b = scores.args[0], scores.args[1]
        else:
            continue
        if len(scores.users) != 1:
            continue
        parts.add(scores)
        q = through_views(a, parts)
        kt = through_views(b, parts)
        if scale is None:  # nn.MultiheadAttention scales q before its product
            scale = scale_of(q)
            if scale is None:
                continue
            parts.add(q)
            q = through_views(q.args[0], parts)
        if not call(kt, aten.transpose.int) or len(kt.users) != 1:
            continue
        rank = len(kt.meta["val"].shape) if "val" in kt.meta else None
        dims = {d % rank for d in kt.args[1:3]} if rank else set(kt.args[1:3])
        if dims not in ({rank - 2, rank - 1} if rank else set(), {-2, -1}):
            continue
        parts.add(kt)
        found[out] = (q, kt.args[0], v, scale, mask, additive, parts)
        all_parts |= parts
    return found, all_parts
