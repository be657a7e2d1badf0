#!/usr/bin/python3
"""PyTorch side of the imported-module parity test (tests/train/torch_import_parity_test.cc).

The module is the user's own (FILE.py:FACTORY, as tools/torch_export.py took it), so this script
trains that module itself, not a re-implementation of it:

  1. build the module, load the weights the exporter wrote (init.safetensors) with
     load_state_dict(strict=False), and train it as `sluice train` does: per step one batch
     ("tokens.<step>", "targets.<step>" of the input file for a token model; "NAME.<step>" for each
     argument NAME of a forward reading arrays), its mean loss, backward, one AdamW step
     (torch.optim.AdamW with the metadata's lr, betas, eps and weight_decay; no clipping);
  2. build a fresh module and load sluice's trained checkpoint into it with
     load_state_dict(strict=False): every parameter must be restored (a missing key is allowed
     only for the second name of a tied Parameter, which the first name restores), the optimizer
     state (NAME.exp_avg, NAME.exp_avg_sq, ...) is the only unexpected kind of key; then its loss
     on the batch of the step after the checkpoint ("tokens.<steps>", ...).

With "seed": S in the input's config, PyTorch's generator starts from S (dropout's masks; 0 by
default). With "autocast": true in the input's config, step 1 runs under torch.autocast("cpu",
dtype=torch.bfloat16) (the reference of sluice's --precision bf16).

Writes OUTPUT.safetensors: "losses" f64 [steps], "final.<name>" of every parameter and buffer
after the last step, "checkpoint_loss" f64 [1] and "eval_loss" f64 [1] (the same under
module.eval(): batch norm by the running statistics of the checkpoint).

Usage: torch_import_reference.py FILE.py:FACTORY INPUT INIT CHECKPOINT OUTPUT
"""
import importlib.util
import inspect
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import read_safetensors, write_safetensors  # noqa: E402


def build(spec):
    path, _, factory = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location("user_models", path)
    mod = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(mod)
    return getattr(mod, factory)()


def load(module, weights, what):
    names = dict(module.named_parameters())
    keys = set(weights)
    tensors = {k: v for k, v in weights.items() if k in module.state_dict()}
    result = module.load_state_dict(tensors, strict=False)
    # A tied Parameter is one tensor under two names: loading the first restores the second.
    ids_loaded = {id(p) for n, p in module.named_parameters() if n in keys}
    aliases = _all_parameters(module)
    for missing in result.missing_keys:
        if missing not in aliases or not aliases[missing].requires_grad:
            continue  # a buffer or a frozen parameter: a constant of the program, kept as it was
        if id(aliases[missing]) not in ids_loaded:
            sys.exit(f"{what}: parameter {missing} is missing")
    unexpected = sorted(keys - set(module.state_dict()))
    for k in unexpected:
        base = k.rsplit(".", 1)[0]
        if base not in names and k != "step":
            sys.exit(f"{what}: unexpected tensor {k} (neither a parameter nor its optimizer state)")
    return module


def _all_parameters(module):
    out = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        for attr, p in sub._parameters.items():
            if p is not None:
                out[f"{path}.{attr}" if path else attr] = p
    return out


def batch_of(batches, names, step):
    return [batches[f"{n}.{step}"] for n in names]


def main():
    spec, input_path, init_path, checkpoint_path, output_path = sys.argv[1:6]
    torch.set_num_threads(1)
    batches, meta = read_safetensors(input_path)
    cfg = json.loads(meta["config"])
    # The seed of PyTorch's random draws in training: dropout's masks.
    torch.manual_seed(cfg.get("seed", 0))
    init, _ = read_safetensors(init_path)

    model = load(build(spec), init, init_path)
    # A token model's program inputs are tokens and targets whatever forward calls them; a module
    # reading arrays has one input per forward argument, of its name.
    # (A module reading arrays may call one of them `tokens`: its arguments decide, not the keys.)
    arguments = list(inspect.signature(model.forward).parameters)
    names = (arguments if all(f"{n}.0" in batches for n in arguments)
             else ["tokens", "targets"])
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                            eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    losses = []
    # "autocast": true trains under torch.autocast("cpu", dtype=torch.bfloat16), the reference of
    # sluice's --precision bf16 (the weights and AdamW stay f32 in both).
    bf16 = bool(cfg.get("autocast", False))
    for step in range(cfg["steps"]):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(*batch_of(batches, names, step))
        loss.float().backward()
        losses.append(loss.item())
        opt.step()
    out = {"losses": torch.tensor(losses, dtype=torch.float64)}
    out.update({f"final.{n}": p.detach().clone() for n, p in model.named_parameters()})
    # Buffers: the program's constants (rotary tables) stay as they were, its buffers (batch
    # norm's running statistics) move in every forward; sluice keeps them so.
    # (A boolean mask buffer is folded into the program, never a constant: left out.)
    out.update({f"final.{n}": b.detach().clone() for n, b in model.named_buffers()
                if b.is_floating_point()})

    trained, _ = read_safetensors(checkpoint_path)
    restored = load(build(spec), trained, checkpoint_path)
    with torch.no_grad():
        s = cfg["steps"]
        # module.eval() first (batch norm by the running statistics sluice saved), then in
        # training mode, which moves them.
        restored.eval()
        out["eval_loss"] = torch.tensor(
            [restored(*batch_of(batches, names, s)).item()], dtype=torch.float64)
        restored.train()
        out["checkpoint_loss"] = torch.tensor(
            [restored(*batch_of(batches, names, s)).item()], dtype=torch.float64)
    write_safetensors(output_path, out)


if __name__ == "__main__":
    main()
