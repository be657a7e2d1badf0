"""Plain PyTorch classifiers on arrays that tools/torch_export.py imports in the parity tests
(tests/train/torch_import_parity_test.cc) and in docs/torch-export.md ("Arrays: features and
labels"). Each forward takes a batch of examples and their class labels, bound by name to the
arrays of a safetensors data file, and returns F.cross_entropy of the logits.

  mlp_classifier  the MLP a user writes first: an nn.Sequential of Linear, GELU, LayerNorm, ReLU,
                  Dropout(0), Tanh over 8 float features into 4 classes (forward(features, label),
                  the arrays of examples/classifier_data.py).
  smoothed_mean   LeakyReLU, a LayerNorm without weight and bias, Softplus(beta=2), and a
  smoothed_sum    cross-entropy with label_smoothing=0.1, reduction "mean" / "sum".
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

