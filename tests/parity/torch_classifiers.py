"""Plain PyTorch classifiers on arrays that tools/torch_export.py imports in the parity tests
(tests/train/torch_import_parity_test.cc) and in docs/torch-export.md ("Arrays: features and
labels"). Each forward takes a batch of examples and their class labels, bound by name to the
arrays of a safetensors data file, and returns F.cross_entropy of the logits.

  mlp_classifier  the MLP a user writes first: an nn.Sequential of Linear, GELU, LayerNorm, ReLU,
                  Dropout(0), Tanh over 8 float features into 4 classes (forward(features, label),
                  the arrays of examples/classifier_data.py).
  smoothed_mean   LeakyReLU, a LayerNorm without weight and bias, Softplus(beta=2), and a
  smoothed_sum    cross-entropy with label_smoothing=0.1, reduction "mean" / "sum".
  cnn             a small convolutional network on the images of examples/bars_data.py
                  (forward(image, label), image [B, 1, 12, 12]): Conv2d, ReLU, MaxPool2d, Conv2d
                  (stride 1, padding 1), GroupNorm, ReLU, AvgPool2d, Flatten, Linear.
  conv1d          Conv1d (stride 2) over each image's rows read as a sequence of 12 channels.
"""
import torch.nn as nn
import torch.nn.functional as F


class MlpClassifier(nn.Module):
    def __init__(self, features=8, hidden=32, classes=4):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.GELU(), nn.LayerNorm(hidden),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.0),
            nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, classes))

    def forward(self, features, label):
        return F.cross_entropy(self.net(features), label)


def mlp_classifier():
    return MlpClassifier()


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
