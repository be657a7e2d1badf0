#!/usr/bin/python3
"""Writes tests/ops/data/rms_norm_reference.json: PyTorch 1.13 RMSNorm outputs and gradients that
tests/ops/nn_test.cc compares with sluice's rms_norm op and its VJP (rms_norm_grad_x,
rms_norm_grad_weight).

PyTorch 1.13 has no nn.RMSNorm (it came in 2.4), so the reference is the expression Llama-style
models write, differentiated by autograd:

    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

Each case draws x, weight and an upstream gradient dy, computes y, dx and dweight in float64 and in
float32 (the inputs rounded to float32 first, so both sides start from the same values), and
records them flattened.

Run from anywhere:  /usr/bin/python3 tests/parity/rms_norm_reference.py
"""
import json
import os

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ops", "data", "rms_norm_reference.json")


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def record(shape, eps, x_scale, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    c = shape[-1]
    x = ((torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * x_scale).to(dtype)
    weight = (torch.rand(c, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    dy = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
    x.requires_grad_(True)
    weight.requires_grad_(True)
    y = rms_norm(x, weight, eps)
    y.backward(dy)

    def flat(t):
        return t.detach().double().flatten().tolist()

    return {"x": flat(x), "weight": flat(weight), "dy": flat(dy), "y": flat(y), "dx": flat(x.grad),
            "dweight": flat(weight.grad)}


def main():
    # name, shape [..., C], eps, scale of x
    cases = [
        ("llama_eps", [2, 3, 16], 1e-6, 1.0),
        ("odd_channels", [5, 33], 1e-5, 3.0),
        ("large_eps", [4, 7], 1e-2, 1.0),
        ("small_x", [3, 9], 1e-5, 0.01),  # mean(x²) ≈ 3e-5: eps matters
    ]
    out = {"torch_version": torch.__version__, "cases": []}
    for i, (name, shape, eps, x_scale) in enumerate(cases):
        case = {"name": name, "shape": shape, "eps": eps}
        for label, dtype in (("f64", torch.float64), ("f32", torch.float32)):
            case[label] = record(shape, eps, x_scale, 200 + i, dtype)
        out["cases"].append(case)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
