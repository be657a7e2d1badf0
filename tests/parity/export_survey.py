"""Which of the modules users commonly bring tools/torch_export.py takes, and why it refuses the
others: whole models (a CIFAR ResNet-8 with BatchNorm, an MLP-Mixer, a 1-D convolutional text
classifier, a tiny encoder-decoder nn.Transformer, an LSTM language model, a bidirectional GRU
classifier, an LSTM encoder-decoder, a MobileNetV2 and a ConvNeXt-style network, a UNet) and one
small module per layer or idiom, each exported at batch 4; prints one line per module, "ok" or
the exporter's error.

  /usr/bin/python3 tests/parity/export_survey.py            # all
  /usr/bin/python3 tests/parity/export_survey.py resnet8    # the ones named

docs/torch-export.md ("What users bring") keeps the table this prints.
"""
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_classifiers import (BasicBlock, ConvNeXtBlock, InvertedResidual,  # the same directory
                               TinyUNet)

HERE = os.path.dirname(os.path.abspath(__file__))
EXPORTER = os.path.join(HERE, "..", "..", "tools", "torch_export.py")


# ---- whole models ------------------------------------------------------------------------------

class ResNet8(nn.Module):
    """ResNet-8 for 3x16x16 images (CIFAR-like): stem, three stages of one basic block each,
    adaptive average pooling, a linear head."""

    def __init__(self, width=8, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
                                    BasicBlock(2 * width, 4 * width, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4 * width, classes)

    def forward(self, image, label):
        h = self.pool(self.layers(self.stem(image)))
        return F.cross_entropy(self.head(torch.flatten(h, 1)), label)


class MixerBlock(nn.Module):
    def __init__(self, patches, channels):
        super().__init__()
        self.norm1 = nn.LayerNorm(channels)
        self.tokens = nn.Sequential(nn.Linear(patches, 2 * patches), nn.GELU(),
                                    nn.Linear(2 * patches, patches))
        self.norm2 = nn.LayerNorm(channels)
        self.channels = nn.Sequential(nn.Linear(channels, 2 * channels), nn.GELU(),
                                      nn.Linear(2 * channels, channels))

    def forward(self, x):  # x [B, P, C]
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Mixer(nn.Module):
    """MLP-Mixer on 3x16x16 images, 4x4 patches."""

    def __init__(self, channels=16, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, channels, 4, stride=4)
        self.blocks = nn.Sequential(MixerBlock(16, channels), MixerBlock(16, channels))
        self.norm = nn.LayerNorm(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, image, label):
        x = self.patch(image).flatten(2).transpose(1, 2)  # [B, P, C]
        x = self.norm(self.blocks(x)).mean(1)
        return F.cross_entropy(self.head(x), label)


class TextCnn(nn.Module):
    """A 1-D convolutional text classifier: embeddings (padding_idx 0), Conv1d with BatchNorm1d
    and ReLU, global max pooling over time, a linear head."""

    def __init__(self, vocab=32, dim=16, classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.conv = nn.Conv1d(dim, 32, 3, padding=1)
        self.bn = nn.BatchNorm1d(32)
        self.head = nn.Linear(32, classes)

    def forward(self, tokens, label):
        h = self.embed(tokens).transpose(1, 2)  # [B, C, T]
        h = F.relu(self.bn(self.conv(h))).amax(-1)
        return F.cross_entropy(self.head(h), label)


class TinySeq2Seq(nn.Module):
    """nn.Transformer (encoder-decoder, cross-attention), tied input/output embeddings."""

    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(12, dim) * 0.02)
        self.transformer = nn.Transformer(dim, 2, 1, 1, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("causal", torch.triu(torch.full((12, 12), float("-inf")), 1))

    def forward(self, tokens, label):
        T = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:T]
        y = self.transformer(x, x, tgt_mask=self.causal[:T, :T])
        return F.cross_entropy(self.head(y).flatten(0, 1), label.flatten())


class LstmLM(nn.Module):
    """An LSTM language model: embeddings, a 2-layer nn.LSTM with dropout between the layers,
    a linear head over every position."""

    def __init__(self, vocab=32, dim=16, hidden=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, dropout=0.2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens, label):
        h, _ = self.lstm(self.embed(tokens))
        return F.cross_entropy(self.head(h).flatten(0, 1), label.flatten())


class GruClassifier(nn.Module):
    """A bidirectional nn.GRU text classifier on its final states."""

    def __init__(self, vocab=32, dim=16, hidden=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.gru = nn.GRU(dim, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, 2)

    def forward(self, tokens, label):
        _, h = self.gru(self.embed(tokens))
        return F.cross_entropy(self.head(torch.cat([h[0], h[1]], 1)), label)


class LstmSeq2Seq(nn.Module):
    """An LSTM encoder-decoder: the decoder starts from the encoder's final (h, c)."""

    def __init__(self, vocab=32, dim=16, hidden=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.LSTM(dim, hidden, batch_first=True)
        self.decoder = nn.LSTM(dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens, label):
        _, state = self.encoder(self.embed(tokens))
        y, _ = self.decoder(self.embed(label), state)
        return F.cross_entropy(self.head(y).flatten(0, 1), label.flatten())


# ---- one layer or idiom each -------------------------------------------------------------------

class Features(nn.Module):
    """`body` applied to f32[B, 8] features, then a linear head to 2 classes."""

    def __init__(self, body, width=8):
        super().__init__()
        self.body = body
        self.head = nn.Linear(width, 2)

    def forward(self, features, label):
        return F.cross_entropy(self.head(self.body(features).flatten(1)), label)


class Image(Features):
    """`body` applied to f32[B, 4, 6, 6] images; `width` the flattened size of its output."""

    def forward(self, image, label):
        return super().forward(image, label)


class Sequence(nn.Module):
    """The recurrent layer `body` over f32[B, 12, 8] sequences (time-major when it is not
    batch_first), its outputs' mean over time into a linear head to 2 classes."""

    def __init__(self, body):
        super().__init__()
        self.body = body
        width = body.hidden_size * (2 if body.bidirectional else 1)
        self.head = nn.Linear(getattr(body, "proj_size", 0) or width, 2)

    def forward(self, sequence, label):
        x = sequence if self.body.batch_first else sequence.transpose(0, 1)
        y, _ = self.body(x)
        return F.cross_entropy(self.head(y.mean(1 if self.body.batch_first else 0)), label)


class PackedLstm(Sequence):
    """An nn.LSTM over a PackedSequence (pack_padded_sequence)."""

    def __init__(self):
        super().__init__(nn.LSTM(8, 8, batch_first=True))

    def forward(self, sequence, label):
        x = nn.utils.rnn.pack_padded_sequence(sequence, [12] * len(sequence), batch_first=True)
        y, _ = nn.utils.rnn.pad_packed_sequence(self.body(x)[0], batch_first=True)
        return F.cross_entropy(self.head(y.mean(1)), label)


class PaddedEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8, padding_idx=0)
        self.head = nn.Linear(8, 2)

    def forward(self, tokens, label):
        return F.cross_entropy(self.head(self.embed(tokens).mean(1)), label)


class CrossAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, tokens, label):
        x = self.embed(tokens)
        q = x[:, :2]
        y, _ = self.attn(q, x, x, need_weights=False)
        return F.cross_entropy(self.head(y.mean(1)), label)


class MobileNetV2(nn.Module):
    """MobileNetV2 on 3x16x16 images: a stem, inverted residual blocks (1x1 expansion, 3x3
    depthwise, 1x1 projection, ReLU6), global pooling, a linear head."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(16, 16, 1, 6), InvertedResidual(16, 24, 2, 6),
                                    InvertedResidual(24, 24, 1, 6))
        self.head = nn.Linear(24, classes)

    def forward(self, image, label):
        h = self.blocks(self.stem(image)).mean((2, 3))
        return F.cross_entropy(self.head(h), label)


class ConvNeXtNet(nn.Module):
    """ConvNeXt on 3x16x16 images: a 4x4 patchify stem, two ConvNeXt blocks (7x7 depthwise,
    LayerNorm channels-last, MLP, layer scale), pooling, LayerNorm, a linear head."""

    def __init__(self, dim=16, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, stride=4)
        self.blocks = nn.Sequential(ConvNeXtBlock(dim), ConvNeXtBlock(dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, image, label):
        h = self.blocks(self.stem(image)).mean((2, 3))
        return F.cross_entropy(self.head(self.norm(h)), label)


FEATURES = {"features": "f32[8]", "label": "i64[]"}
IMAGES = {"image": "f32[4, 6, 6]", "label": "i64[]"}
IMAGES3 = {"image": "f32[3, 16, 16]", "label": "i64[]"}
GRAY = {"image": "f32[1, 12, 12]", "label": "i64[]"}
TOKENS = {"tokens": "i64[12]", "label": "i64[]"}
SEQUENCES = {"sequence": "f32[12, 8]", "label": "i64[]"}

MODULES = {
    # name: (factory, forward's argument types)
    "resnet8": (ResNet8, IMAGES3),
    "mixer": (Mixer, IMAGES3),
    "text_cnn": (TextCnn, TOKENS),
    "seq2seq": (TinySeq2Seq, {"tokens": "i64[12]", "label": "i64[12]"}),
    "lstm_lm": (LstmLM, {"tokens": "i64[12]", "label": "i64[12]"}),
    "gru_classifier": (GruClassifier, TOKENS),
    "lstm_seq2seq": (LstmSeq2Seq, {"tokens": "i64[12]", "label": "i64[12]"}),
    "mobilenet_v2": (MobileNetV2, IMAGES3),
    "convnext": (ConvNeXtNet, IMAGES3),
    "unet": (TinyUNet, GRAY),
    "batch_norm_2d": (lambda: Image(nn.BatchNorm2d(4), 4 * 36), IMAGES),
    "batch_norm_1d": (lambda: Features(nn.BatchNorm1d(8)), FEATURES),
    "group_norm": (lambda: Image(nn.GroupNorm(2, 4), 4 * 36), IMAGES),
    "embedding_padding_idx": (PaddedEmbedding, TOKENS),
    "gelu_tanh": (lambda: Features(nn.GELU(approximate="tanh")), FEATURES),
    "silu": (lambda: Features(nn.SiLU()), FEATURES),
    "mish": (lambda: Features(nn.Mish()), FEATURES),
    "hardswish": (lambda: Features(nn.Hardswish()), FEATURES),
    "strided_1x1_conv": (lambda: Image(nn.Conv2d(4, 4, 1, stride=2), 4 * 9), IMAGES),
    "adaptive_avg_pool": (lambda: Image(nn.AdaptiveAvgPool2d(1), 4), IMAGES),
    "conv_bias": (lambda: Image(nn.Conv2d(4, 4, 3, padding=1, bias=True), 4 * 36), IMAGES),
    "conv1d": (lambda: Image(nn.Sequential(nn.Flatten(1, 2), nn.Conv1d(24, 4, 3)), 4 * 4),
               IMAGES),
    "cross_attention": (CrossAttention, TOKENS),
    "lstm": (lambda: Sequence(nn.LSTM(8, 8, batch_first=True)), SEQUENCES),
    "lstm_2_layers_time_major": (lambda: Sequence(nn.LSTM(8, 8, num_layers=2)), SEQUENCES),
    "lstm_bidirectional": (lambda: Sequence(nn.LSTM(8, 8, batch_first=True, bidirectional=True)),
                           SEQUENCES),
    "gru": (lambda: Sequence(nn.GRU(8, 8, batch_first=True)), SEQUENCES),
    "rnn_tanh": (lambda: Sequence(nn.RNN(8, 8, batch_first=True)), SEQUENCES),
    "rnn_relu_no_bias": (lambda: Sequence(nn.RNN(8, 8, nonlinearity="relu", bias=False,
                                                 batch_first=True)), SEQUENCES),
    "lstm_proj_size": (lambda: Sequence(nn.LSTM(8, 16, batch_first=True, proj_size=8)),
                       SEQUENCES),
    "lstm_packed_sequence": (PackedLstm, SEQUENCES),
    "depthwise_conv": (lambda: Image(nn.Conv2d(4, 4, 3, padding=1, groups=4), 4 * 36), IMAGES),
    "grouped_conv": (lambda: Image(nn.Conv2d(4, 8, 3, groups=2), 8 * 16), IMAGES),
    "dilated_conv": (lambda: Image(nn.Conv2d(4, 4, 3, padding=2, dilation=2), 4 * 36), IMAGES),
    "dilated_conv1d": (lambda: Image(nn.Sequential(nn.Flatten(1, 2),
                                                   nn.Conv1d(24, 4, 3, dilation=2)), 4 * 2),
                       IMAGES),
    "conv_transpose": (lambda: Image(nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1,
                                                        output_padding=1), 2 * 144), IMAGES),
    "upsample_nearest": (lambda: Image(nn.Upsample(scale_factor=2), 4 * 144), IMAGES),
    "upsample_bilinear": (lambda: Image(nn.Upsample(scale_factor=2, mode="bilinear"), 4 * 144),
                          IMAGES),
}


def export(name, out_root):
    """Runs the exporter on MODULES[name]; returns "ok" or its error's first line."""
    _, types = MODULES[name]
    cmd = [sys.executable, EXPORTER, f"{__file__}:survey_{name}", "--batch", "4",
           "--out", os.path.join(out_root, name)]
    for arg, t in types.items():
        cmd += ["--input", f"{arg}={t}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode == 0:
        return "ok"
    lines = [l for l in r.stderr.splitlines() if "error" in l] or r.stderr.splitlines()[-1:]
    return lines[0] if lines else f"exit {r.returncode}"


for _name, (_factory, _) in MODULES.items():  # the factories the exporter loads by name
    globals()[f"survey_{_name}"] = (lambda f: lambda: (torch.manual_seed(0), f())[1])(_factory)


def main(names):
    with tempfile.TemporaryDirectory() as out_root:
        for name in names or MODULES:
            print(f"{name:24} {export(name, out_root)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
