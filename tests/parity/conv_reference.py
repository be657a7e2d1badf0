#!/usr/bin/python3
"""Writes tests/ops/data/conv_reference.json: PyTorch 1.13 conv2d, max_pool2d and avg_pool2d
outputs and gradients that tests/ops/conv_test.cc compares with sluice's conv2d (with groups and
dilation), max_pool2d and avg_pool2d ops and their VJPs.

Each case draws x (and the filters w) and an upstream gradient dy in float64, computes y and the
gradients of x (and w) by autograd, and records them flattened. The max-pooling case passes x
through relu first, so that windows hold ties of 0 (PyTorch sends their gradient to the first).

Run from anywhere:  /usr/bin/python3 tests/parity/conv_reference.py
"""
import json
import os

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ops", "data",
                   "conv_reference.json")


def flat(t):
    return t.detach().double().flatten().tolist()


def uniform(gen, shape):
    return torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1


def conv_case(name, x_shape, w_shape, stride, padding, seed, dilation=(1, 1), groups=1):
    gen = torch.Generator().manual_seed(seed)
    x = uniform(gen, x_shape).requires_grad_(True)
    w = uniform(gen, w_shape).requires_grad_(True)
    y = F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    dy = uniform(gen, list(y.shape))
    y.backward(dy)
    return {"name": name, "op": "conv2d", "x_shape": x_shape, "w_shape": w_shape,
            "stride": stride, "padding": padding, "dilation": list(dilation), "groups": groups,
            "x": flat(x), "w": flat(w), "dy": flat(dy),
            "y_shape": list(y.shape), "y": flat(y), "dx": flat(x.grad), "dw": flat(w.grad)}


def pool_case(name, op, x_shape, kernel, stride, padding, seed):
    gen = torch.Generator().manual_seed(seed)
    x = uniform(gen, x_shape)
    if op == "max_pool2d":
        x = torch.relu(x)  # ties of 0
    x.requires_grad_(True)
    pool = F.max_pool2d if op == "max_pool2d" else F.avg_pool2d
    y = pool(x, kernel, stride, padding)
    dy = uniform(gen, list(y.shape))
    y.backward(dy)
    return {"name": name, "op": op, "x_shape": x_shape, "kernel": kernel, "stride": stride,
            "padding": padding, "x": flat(x), "dy": flat(dy), "y_shape": list(y.shape),
            "y": flat(y), "dx": flat(x.grad)}


def main():
    cases = [
        conv_case("conv_3x3_same", [2, 3, 6, 5], [4, 3, 3, 3], [1, 1], [1, 1], 300),
        conv_case("conv_strided", [2, 2, 7, 7], [3, 2, 3, 2], [2, 3], [1, 0], 301),
        conv_case("conv_1x1", [1, 4, 3, 3], [2, 4, 1, 1], [1, 1], [0, 0], 302),
        conv_case("conv_depthwise", [2, 3, 6, 5], [3, 1, 3, 3], [2, 1], [1, 1], 307, groups=3),
        conv_case("conv_grouped_dilated", [2, 4, 9, 8], [6, 2, 3, 2], [1, 2], [2, 1], 308,
                  dilation=(2, 3), groups=2),
        conv_case("conv_depthwise_16", [2, 16, 5, 4], [16, 1, 3, 3], [1, 1], [1, 1], 309,
                  groups=16),
        pool_case("max_2x2", "max_pool2d", [2, 3, 6, 6], [2, 2], [2, 2], [0, 0], 303),
        pool_case("max_3x3_padded", "max_pool2d", [1, 2, 7, 5], [3, 3], [2, 2], [1, 1], 304),
        pool_case("avg_2x2", "avg_pool2d", [2, 3, 6, 6], [2, 2], [2, 2], [0, 0], 305),
        pool_case("avg_3x3_padded", "avg_pool2d", [1, 2, 7, 5], [3, 3], [2, 1], [1, 1], 306),
    ]
    with open(OUT, "w") as f:
        json.dump({"torch_version": torch.__version__, "cases": cases}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
