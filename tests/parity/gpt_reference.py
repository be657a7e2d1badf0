#!/usr/bin/env python3
"""PyTorch reference for sluice's GPT parity test (tests/train/parity_test.cc).

Reads a safetensors file written by sluice with the initial weights (GPT-2 names, block weights
[in, out], lm_head.weight [vocab, C]), the token ids and targets of every micro-batch of every step
("ids.<step>.<micro-batch>", "targets.<step>.<micro-batch>"), and the configuration in its
metadata; builds the same nanoGPT-style model in PyTorch and trains it as `sluice train` does:
per step, the gradients of every micro-batch's mean loss averaged over the micro-batches,
torch.nn.utils.clip_grad_norm_ to the configured norm, one AdamW step. Writes a safetensors file
with the per-step losses ("losses", f64 [steps], the mean over micro-batches), the gradient norms
before clipping ("grad_norms", f64 [steps]), the first step's averaged gradients ("<param>.grad")
and the weights after the last step ("final.<param>").

With "precision": "bf16" in the configuration, every forward runs under PyTorch's own mixed
precision, torch.autocast("cpu", dtype=torch.bfloat16) (what users compare sluice's
`--precision bf16` with); parameters, gradients and AdamW stay f32 as they do in sluice.

With --golden GOLDEN.json it also writes the small golden file the parity test reads where
PyTorch is absent: the configuration, every micro-batch and the per-step losses and norms.

Only the Python standard library and torch (Debian's python3-torch) are used: safetensors is read
and written by tools/torch_export/safetensors_file.py (struct and json).

Usage: gpt_reference.py INPUT.safetensors OUTPUT.safetensors [--golden GOLDEN.json]
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tools"))
from torch_export.safetensors_file import read_safetensors, write_safetensors  # noqa: E402,F401


def forward(p, ids, targets, cfg):
    B, T = ids.shape
    C, H, L = cfg["dim"], cfg["heads"], cfg["layers"]
    D = C // H
    x = p["wte.weight"][ids] + p["wpe.weight"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for l in range(L):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps=1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps=1e-5)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + (m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)
    logits = x @ p["lm_head.weight"].t()
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)


def main():
    args = sys.argv[1:]
    golden = None
    if "--golden" in args:
        i = args.index("--golden")
        golden = args[i + 1]
        del args[i:i + 2]
    tensors, meta = read_safetensors(args[0])
    cfg = json.loads(meta["config"])
    torch.set_num_threads(1)
    params = {k[len("param."):]: v.requires_grad_() for k, v in tensors.items() if k.startswith("param.")}
    opt = torch.optim.AdamW(list(params.values()), lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                            eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    M = cfg["microbatches"]
    losses, norms, out = [], [], {}
    for step in range(cfg["steps"]):
        opt.zero_grad()
        total = 0.0
        for k in range(M):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.get("precision") == "bf16"):
                loss = forward(params, tensors[f"ids.{step}.{k}"], tensors[f"targets.{step}.{k}"], cfg)
            (loss / M).backward()
            total += loss.item()
        if step == 0:
            out.update({f"{k}.grad": v.grad.detach().float().clone() for k, v in params.items()})
        clip = cfg["clip"] if cfg["clip"] > 0 else float("inf")
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), clip)))
        losses.append(total / M)
        opt.step()
    out["losses"] = torch.tensor(losses, dtype=torch.float64)
    out["grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    out.update({f"final.{k}": v.detach().clone() for k, v in params.items()})
    write_safetensors(args[1], out)
    if golden:
        batches = {k: tensors[k].reshape(-1).tolist() for k in sorted(tensors) if k.startswith(("ids.", "targets."))}
        with open(golden, "w") as f:
            json.dump({"produced_by": f"tests/parity/gpt_reference.py with torch {torch.__version__}",
                       "config": cfg, "batches": batches, "losses": losses, "grad_norms": norms}, f,
                      separators=(",", ":"))
            f.write("\n")


if __name__ == "__main__":
    main()
