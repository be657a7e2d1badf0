"""Modules tools/torch_export.py must refuse, each with a clear error and nothing written
(tests/parity/torch_export_test.py). Each factory is one way a user's module can be wrong, except
tiny (a valid module the others change), recurrent (valid: a GRU unrolled over T), frozen
(valid: a parameter with requires_grad False becomes a constant), additive_mask (valid: a mask
buffer that is not causal becomes a program constant) and near_misses, pair_mask (valid:
patterns the exporter fuses, each changed so that it no longer fits, stay written out)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    """A valid module: an embedding and a head; the others change one thing of it."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.head = nn.Linear(8, 11)

    def logits(self, tokens):
        return self.head(self.embed(tokens))

    def forward(self, tokens, targets):
        x = self.logits(tokens)
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class OtherArguments(TinyLM):
    def forward(self, tokens):
        return self.logits(tokens).mean()


class Classifier(nn.Module):
    """A classifier on arrays: forward(x, y), x f32 [B, 8], y i64 [B] (valid; the array cases)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(x), y)


class ImageNet(nn.Module):
    """forward(x, y), x f32 [B, 2, 8, 8]: one layer, then a linear head (the convolution cases);
    with pooled=(2,), x f32 [B, 2, 8] (the Conv1d cases)."""

    def __init__(self, layer, channels, pooled=(2, 3)):
        super().__init__()
        self.layer = layer
        self.pooled = pooled
        self.fc = nn.Linear(channels, 2)

    def forward(self, x, y):
        h = self.layer(x)
        return F.cross_entropy(self.fc(h.mean(dim=self.pooled)), y)


class NotScalar(TinyLM):
    def forward(self, tokens, targets):
        loss = F.cross_entropy(self.logits(tokens).view(-1, 11), targets.view(-1))
        return loss.view(1)  # a tensor of one loss, not a scalar


class BranchOnValues(TinyLM):
    def forward(self, tokens, targets):
        x = self.logits(tokens)
        if x.sum() > 0:  # data-dependent control flow
            x = x * 2
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class BranchOnLength(TinyLM):
    def forward(self, tokens, targets):
        x = self.logits(tokens)
        if tokens.shape[1] % 2 == 0:  # another program at another sequence length
            x = torch.tanh(x)
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class Cumulative(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.mix = Mixer()
        self.head = nn.Linear(8, 11)

    def forward(self, tokens, targets):
        x = self.head(self.mix(self.embed(tokens)))
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class Mixer(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)  # an op sluice has no mapping for


class AdditiveMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.qkv = nn.Linear(8, 24)
        self.head = nn.Linear(8, 11)
        self.register_buffer("mask", torch.randn(6, 6))  # added to the scores; not causal

    def forward(self, tokens, targets):
        B, T = tokens.shape
        q, k, v = self.qkv(self.embed(tokens)).split(8, dim=2)
        att = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + self.mask[:T, :T], dim=-1)
        x = self.head(att @ v)
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class NearMisses(nn.Module):
    """Grouped-query attention under a mask that is not causal (no causal_attention: the repeated
    keys and values are copied), and a SiLU gate by a parameter broadcast over the tokens (not
    two values of one shape: silu then mul, no swiglu)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 4)
        self.v = nn.Linear(8, 4)
        self.gate = nn.Parameter(torch.randn(8))
        self.head = nn.Linear(8, 11)
        self.register_buffer("mask", torch.randn(6, 6))

    def forward(self, tokens, targets):
        B, T = tokens.shape
        x = self.embed(tokens)
        q = self.q(x).view(B, T, 2, 4).transpose(1, 2)  # 2 query heads, 1 key/value head
        k = self.k(x).view(B, T, 1, 4).transpose(1, 2).repeat_interleave(2, dim=1)
        v = self.v(x).view(B, T, 1, 4).transpose(1, 2).repeat_interleave(2, dim=1)
        att = F.softmax(q @ k.transpose(-2, -1) / 2.0 + self.mask[:T, :T], dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, 8)
        x = self.head(F.silu(y) * self.gate)
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class PairMask(nn.Module):
    """Bidirectional attention under a mask computed from the tokens per pair of positions
    ([B, 1, T, T]: not one value per key, so not a key bias): it stays written out."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.qkv = nn.Linear(8, 24)
        self.head = nn.Linear(8, 11)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        q, k, v = (h.view(B, T, 2, 4).transpose(1, 2)
                   for h in self.qkv(self.embed(tokens)).split(8, dim=-1))
        same = tokens[:, None, :, None] == tokens[:, None, None, :]
        att = F.softmax((q @ k.transpose(-2, -1) / 2.0).masked_fill(~same, float("-inf")), dim=-1)
        x = self.head((att @ v).transpose(1, 2).reshape(B, T, 8))
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class Recurrent(nn.Module):
    """A GRU language model: valid, unrolled over the sequence length it is exported for."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.rnn = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 11)

    def forward(self, tokens, targets):
        h, _ = self.rnn(self.embed(tokens))
        return F.cross_entropy(self.head(h).view(-1, 11), targets.view(-1), ignore_index=-1)


class PackedLstm(Recurrent):
    """An LSTM reading a PackedSequence: not unrolled."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 8, batch_first=True)

    def forward(self, tokens, targets):
        x = nn.utils.rnn.pack_padded_sequence(self.embed(tokens), [tokens.shape[1]] * len(tokens),
                                              batch_first=True)
        h, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(x)[0], batch_first=True)
        return F.cross_entropy(self.head(h).view(-1, 11), targets.view(-1), ignore_index=-1)


class Dropout(TinyLM):
    """nn.Dropout(p > 0) in training mode (make_fx traces it as empty_like, bernoulli_, div_, mul):
    not bad input any more, a sluice dropout; --without-dropout exports it as p = 0."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, tokens, targets):
        x = self.head(self.drop(self.embed(tokens)))
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class ConstantMask(TinyLM):
    """masked_fill by a constant boolean buffer that is not a causal mask."""

    def __init__(self):
        super().__init__()
        self.register_buffer("band", torch.eye(11, dtype=torch.bool))

    def forward(self, tokens, targets):
        x = self.head(self.embed(tokens))
        x = x.masked_fill(self.band[0], 0.0)
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class PaddingIdx(TinyLM):
    """nn.Embedding(padding_idx=0): PyTorch never trains row 0."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8, padding_idx=0)


class MaxNorm(TinyLM):
    """nn.Embedding(max_norm=1): forward renormalises the weight in place."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8, max_norm=1.0)


class InPlace(TinyLM):
    """An in-place change of an activation."""

    def forward(self, tokens, targets):
        h = self.embed(tokens)
        h.mul_(2.0)
        x = self.head(h)
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class DivideByZero(TinyLM):
    def forward(self, tokens, targets):
        x = self.logits(tokens) / 0.0
        return F.cross_entropy(x.view(-1, 11), targets.view(-1), ignore_index=-1)


class NoParameters(nn.Module):
    def forward(self, tokens, targets):
        return (tokens * 0.0).sum()


def tiny():
    torch.manual_seed(0)
    return TinyLM()


class TwoScalars(TinyLM):
    def forward(self, tokens, targets):
        logits = self.logits(tokens)
        loss = F.cross_entropy(logits.view(-1, 11), targets.view(-1))
        return loss, logits.mean()  # two float scalars: which is the loss?


class LogitsAndLoss(TinyLM):
    def forward(self, tokens, targets):
        logits = self.logits(tokens)
        return logits, F.cross_entropy(logits.view(-1, 11), targets.view(-1))  # nanoGPT's order


def two_scalars():
    return TwoScalars()


def logits_and_loss():
    return LogitsAndLoss()


def other_arguments():
    return OtherArguments()


def classifier():
    return Classifier()


def grouped_conv():
    return ImageNet(nn.Conv2d(2, 4, 3, groups=2), 4)


def dilated_conv():
    return ImageNet(nn.Conv2d(2, 4, 3, dilation=2), 4)


def dilated_depthwise_conv1d():
    return ImageNet(nn.Conv1d(2, 4, 3, padding=2, dilation=2, groups=2), 4, pooled=(2,))


def transposed_conv():
    return ImageNet(nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1), 4)


def nearest_upsample():
    return ImageNet(nn.Upsample(scale_factor=2, mode="nearest"), 2)


def bilinear_upsample():
    return ImageNet(nn.Upsample(scale_factor=2, mode="bilinear"), 2)


def fractional_upsample():
    return ImageNet(nn.Upsample(scale_factor=1.5, mode="nearest"), 2)


def batch_norm():
    return ImageNet(nn.BatchNorm2d(2), 2)


def batch_norm_cumulative():
    return ImageNet(nn.BatchNorm2d(2, momentum=None), 2)


def batch_norm_untracked():
    return ImageNet(nn.BatchNorm2d(2, track_running_stats=False), 2)


def not_scalar():
    return NotScalar()


def branch_on_values():
    return BranchOnValues()


def branch_on_length():
    return BranchOnLength()


def cumulative():
    return Cumulative()


def additive_mask():
    torch.manual_seed(0)
    return AdditiveMask()


def near_misses():
    torch.manual_seed(0)
    return NearMisses()


def pair_mask():
    torch.manual_seed(0)
    return PairMask()


def no_parameters():
    return NoParameters()


def recurrent():
    return Recurrent()


def packed_lstm():
    return PackedLstm()


def dropout():
    return Dropout()


def constant_mask():
    return ConstantMask()


def frozen():
    """Valid: a frozen embedding (requires_grad False) becomes a constant, never trained."""
    torch.manual_seed(0)
    m = TinyLM()
    m.embed.weight.requires_grad_(False)
    return m


def padding_idx():
    return PaddingIdx()


def max_norm():
    return MaxNorm()


def in_place():
    return InPlace()


def divide_by_zero():
    return DivideByZero()


def raises():
    raise ValueError("the factory's own error")


def not_a_module():
    return 42
