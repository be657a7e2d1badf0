#!/usr/bin/python3
"""Writes tests/ops/data/optimizer_reference.json: PyTorch 1.13 SGD and AdamW trajectories that
tests/ops/optimizer_test.cc replays through sluice's sgd_update and adamw_update ops.

Each case starts from a fixed parameter, applies a few steps with given gradients and learning
rates (the learning rate changes per step, as a schedule would), and records the parameter and the
optimizer state after every step, in float64 and in float32.

Run from anywhere:  /usr/bin/python3 tests/parity/optimizer_reference.py
"""
import json
import os

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ops", "data", "optimizer_reference.json")


def trajectory(kind, options, lrs, shape, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    start = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
    grads = [torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1 for _ in lrs]
    param = torch.nn.Parameter(start.clone().to(dtype))
    opt = (torch.optim.SGD if kind == "sgd" else torch.optim.AdamW)([param], lr=lrs[0], **options)
    steps = []
    for lr, g in zip(lrs, grads):
        for group in opt.param_groups:
            group["lr"] = lr
        param.grad = g.clone().to(dtype)
        opt.step()
        state = opt.state[param]
        step = {"param": param.detach().double().flatten().tolist()}
        if kind == "sgd":
            buf = state.get("momentum_buffer")
            step["momentum_buf"] = (buf if buf is not None else torch.zeros(shape)).double().flatten().tolist()
        else:
            step["m"] = state["exp_avg"].double().flatten().tolist()
            step["v"] = state["exp_avg_sq"].double().flatten().tolist()
        steps.append(step)
    return {
        "start": start.to(dtype).double().flatten().tolist(),
        "grads": [g.to(dtype).double().flatten().tolist() for g in grads],
        "steps": steps,
    }


def main():
    cases = [
        ("sgd_momentum", "sgd", {"momentum": 0.9, "weight_decay": 0.01}, [0.1, 0.05, 0.02, 0.02]),
        ("sgd_plain", "sgd", {"momentum": 0.0, "weight_decay": 0.1}, [0.1, 0.2, 0.05]),
        ("adamw_default", "adamw", {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
         [1e-2, 5e-3, 1e-3, 1e-3, 2e-3]),
        ("adamw_gpt", "adamw", {"betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1}, [3e-2, 3e-2, 1e-2, 1e-2]),
    ]
    out = {"torch_version": torch.__version__, "cases": []}
    for i, (name, kind, options, lrs) in enumerate(cases):
        case = {"name": name, "kind": kind, "lrs": lrs, "shape": [3, 4]}
        case["momentum"] = options.get("momentum", 0.0)
        case["weight_decay"] = options["weight_decay"]
        if kind == "adamw":
            case["beta1"], case["beta2"] = options["betas"]
            case["eps"] = options["eps"]
        for label, dtype in (("f64", torch.float64), ("f32", torch.float32)):
            case[label] = trajectory(kind, options, lrs, case["shape"], 100 + i, dtype)
        out["cases"].append(case)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
