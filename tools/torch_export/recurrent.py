"""Recurrent layers (nn.RNN, nn.LSTM, nn.GRU) as unrolled programs.

PyTorch runs a recurrent layer through one fused call (`_VF.lstm`, `_VF.gru`, `_VF.rnn_tanh`) that
reads flat copies of the weights (`module._flat_weights`), not the Parameters the tracer swaps for
placeholders; make_fx then sees the weights as constants, and the in-place gate arithmetic of
ATen's CPU cells (`sigmoid_`, `add_`, `unsafe_split`, `unbind`, `stack`) besides. So while tracing,
each recurrent layer's forward is replaced by `unrolled_forward`: the same arithmetic as PyTorch's
CPU cells, written with ordinary ops over the module's own Parameters (so they are the program's
`param`s under their `named_parameters()` names, trained and written back), unrolled over the
traced sequence length T:

  x          [T, B, C]       time-major (a batch-first input is transposed once)
  xw         [T, B, G·H]     x·W_ihᵀ + b_ih for all T steps in one product (as cuDNN does)
  per step t xw[t] + h·W_hhᵀ + b_hh, split into the G gates (LSTM: i, f, g, o; GRU: r, z, n),
             sigmoid / tanh, the cell update
  output     [T, B, D·H]     the steps' h concatenated (D = 2 when bidirectional), batch-first
                             transposed back; h_n (and c_n) [L·D, B, H]

A zero initial state (hx None) skips the first step's h·W_hhᵀ, as adding a zero product would.
Between layers, dropout > 0 in training is F.dropout, which the exporter maps to sluice's dropout.
The unrolled program is for the traced T only: the exporter keeps T fixed (cli.export).

An LSTM with proj_size > 0 projects each step's h by W_hr (h' = (o·tanh c)·W_hrᵀ), as PyTorch.
Refused, naming the module: a PackedSequence input.
"""
import torch
import torch.nn.functional as F

from .errors import ExportError


def recurrent_layers(module):
    """[(module path, nn.RNNBase)] of every recurrent layer in `module`."""
    return [(path, sub) for path, sub in module.named_modules()
            if isinstance(sub, torch.nn.RNNBase)]


def _kind(sub):
    return f"torch.nn.{type(sub).__name__}"


def check_recurrent(path, sub):
    """Refuses what unrolled_forward does not compute, before tracing."""
    if sub.mode not in ("LSTM", "GRU", "RNN_TANH", "RNN_RELU"):
        raise ExportError(f"module '{path}' is a {_kind(sub)} of mode {sub.mode}: sluice unrolls "
                          f"LSTM, GRU and RNN (tanh or relu) layers only")


def _cell(sub, xw, h, c, w_hh, b_hh, w_hr):
    """One step of `sub`'s cell, as ATen's CPU cells compute it: xw the step's input projection
    (with b_ih) [B, G·H], h and c the state [B, H] (None: zero; h [B, P] with an LSTM's
    projection w_hr [P, H]). Returns (h', c')."""
    hw = b_hh if h is None else F.linear(h, w_hh, b_hh)  # [B, G·H]; h = 0: b_hh alone
    if sub.mode == "GRU":
        # one sigmoid per gate: its output is what both its gradient and the products read
        xr, xz, xn = xw.chunk(3, 1)
        hr, hz, hn = (None, None, None) if hw is None else hw.chunk(3, -1)
        r = torch.sigmoid(xr if hr is None else xr + hr)
        z = torch.sigmoid(xz if hz is None else xz + hz)
        n = torch.tanh(xn if hn is None else xn + r * hn)
        # h' = (1 − z)·n + z·h, written as ATen's GRU cell writes it: n + z·(h − n)
        return (n - z * n if h is None else n + z * (h - n)), None
    gates = xw if hw is None else xw + hw
    if sub.mode == "LSTM":
        i, f, g, o = gates.chunk(4, 1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = i * g if c is None else f * c + i * g
        h = o * torch.tanh(c)
        return (h if w_hr is None else F.linear(h, w_hr)), c
    return (torch.tanh(gates) if sub.mode == "RNN_TANH" else torch.relu(gates)), None


def _direction(sub, x, layer, reverse, h, c):
    """One layer in one direction over x [T, B, C]: its outputs [T, B, H] in time order and its
    final (h, c)."""
    suffix = f"_l{layer}" + ("_reverse" if reverse else "")
    w_ih, w_hh = getattr(sub, "weight_ih" + suffix), getattr(sub, "weight_hh" + suffix)
    b_ih = getattr(sub, "bias_ih" + suffix) if sub.bias else None
    b_hh = getattr(sub, "bias_hh" + suffix) if sub.bias else None
    w_hr = getattr(sub, "weight_hr" + suffix) if getattr(sub, "proj_size", 0) > 0 else None
    xw = F.linear(x, w_ih, b_ih).split(1, 0)  # T pieces [1, B, G·H] of one product
    steps = range(len(xw) - 1, -1, -1) if reverse else range(len(xw))
    outs = [None] * len(xw)
    for t in steps:
        h, c = _cell(sub, xw[t].squeeze(0), h, c, w_hh, b_hh, w_hr)
        outs[t] = h.unsqueeze(0)
    return torch.cat(outs, 0), h, c


def unrolled_forward(sub, path, steps=None):
    """A forward for the recurrent layer `sub` (at `path`) computing what its own forward does,
    unrolled (the module docstring); installed while tracing only. Each call records the steps it
    unrolled in `steps[path]`."""

    def forward(input, hx=None):
        if not isinstance(input, torch.Tensor):
            raise ExportError(f"module '{path}' ({_kind(sub)}) is given a "
                              f"{type(input).__name__}: sluice unrolls a recurrent layer over a "
                              f"padded tensor of fixed length; packed sequences "
                              f"(pack_padded_sequence) are not mapped: pass the padded tensor "
                              f"and mask the padding in the loss")
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1)
            hx = None if hx is None else (
                tuple(s.unsqueeze(1) for s in hx) if isinstance(hx, tuple) else hx.unsqueeze(1))
        elif sub.batch_first:
            input = input.transpose(0, 1)
        if input.shape[-1] != sub.input_size:
            raise ExportError(f"module '{path}' ({_kind(sub)}) expects inputs of "
                              f"{sub.input_size} features, got {input.shape[-1]}")
        if steps is not None:
            steps[path] = input.shape[0]
        dirs = 2 if sub.bidirectional else 1
        h0, c0 = (hx if isinstance(hx, tuple) else (hx, None)) if hx is not None else (None, None)
        x, hs, cs = input, [], []
        for layer in range(sub.num_layers):
            if layer > 0 and sub.dropout > 0 and sub.training:
                x = F.dropout(x, sub.dropout, training=True)
            outs = []
            for d in range(dirs):
                k = layer * dirs + d
                y, h, c = _direction(sub, x, layer, d == 1, None if h0 is None else h0[k],
                                     None if c0 is None else c0[k])
                outs.append(y)
                hs.append(h.unsqueeze(0))
                cs.append(None if c is None else c.unsqueeze(0))
            x = outs[0] if dirs == 1 else torch.cat(outs, 2)
        h_n = torch.cat(hs, 0)
        if unbatched:
            x, h_n = x.squeeze(1), h_n.squeeze(1)
        elif sub.batch_first:
            x = x.transpose(0, 1)
        if sub.mode != "LSTM":
            return x, h_n
        c_n = torch.cat(cs, 0)
        return x, (h_n, c_n.squeeze(1) if unbatched else c_n)

    return forward


class Unrolled:
    """Context: every recurrent layer of `module` runs unrolled_forward inside (the tracer reads
    the layers' Parameters then); their own forwards are back afterwards. `steps`: {module path:
    the steps unrolled} of the layers forward called."""

    def __init__(self, module):
        self.layers = recurrent_layers(module)
        self.steps = {}

    def __enter__(self):
        for path, sub in self.layers:
            sub.forward = unrolled_forward(sub, path, self.steps)
        return self

    def __exit__(self, *exc):
        for _, sub in self.layers:
            del sub.forward  # the class's forward again
        return False
