#!/usr/bin/python3
"""PyTorch 1.13 side of the training benchmark (bench/train_bench.cc runs sluice's side).

The same nanoGPT-style GPT as sluice's (tests/parity/gpt_reference.py: pre-LayerNorm blocks,
biases, GELU tanh, untied head), AdamW, random tokens. Reports tokens/s over --steps timed steps
(after --warmup) and the peak tensor memory of one training step measured with the profiler
(profile_memory=True): the bytes of every live tensor — parameters, optimizer state, gradients,
activations — at the worst moment of forward, backward and the optimizer step. Gradients are
released between steps (zero_grad(set_to_none=True)), as a memory-conscious user would.

Run: /usr/bin/python3 bench/torch_train.py --threads 1 [--checkpoint] [--vocab 256 --layers 4 --heads 4 --dim 128
     --seq 64 --batch 16 --steps 20 --warmup 3]
Prints one JSON object. "blas" names the OpenBLAS kernels PyTorch's GEMM ran: on a CPU the
library does not know they are its SSE3 fallback ("Prescott") unless OPENBLAS_CORETYPE says
otherwise (bench/compare_train.sh runs PyTorch both ways).
"""
import argparse
import ctypes
import json
import math
import os
import sys
import time


def _threads_from_argv(argv):
    """--threads N (or --threads=N) as given, before argparse runs: it is needed before import."""
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


# torch.set_num_threads does not reach the OpenBLAS that PyTorch calls for its GEMMs: OpenBLAS
# starts a thread per core, so "--threads 1" would run GEMMs on every core (177% CPU measured on
# 2 cores) while sluice uses one. OpenBLAS reads its thread count when it loads, with torch.
os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads_from_argv(sys.argv[1:]))

import torch  # noqa: E402 (after OPENBLAS_NUM_THREADS)
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        D = C // self.H
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.H, D).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, T, L, H, C):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, vocab, bias=False)
        self.checkpoint = False
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1), persistent=False)

    def forward(self, ids, targets):
        B, T = ids.shape
        x = self.wte(ids) + self.wpe.weight[:T]
        for block in self.h:
            if self.checkpoint:  # activation checkpointing: keep each block's input only
                x = torch.utils.checkpoint.checkpoint(block, x, self.mask, use_reentrant=False)
            else:
                x = block(x, self.mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(B * T, -1), targets.view(-1))


AUTOCAST = False  # --autocast


def step(model, opt, *inputs):
    """One training step of `model` on its forward's inputs (tokens and targets for the GPT)."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST):
        loss = model(*inputs)
    loss.backward()
    opt.step()
    return loss


def peak_step_bytes(model, opt, *inputs):
    """Live tensor bytes before the step plus the highest running total of the memory the
    profiler attributes to each op (self CPU memory: its allocations minus its frees), the ops
    taken in start order. The op granularity nets allocations and frees inside one op, so the
    figure can sit slightly below the true peak — it favours PyTorch."""
    opt.zero_grad(set_to_none=True)
    live = sum(p.numel() * p.element_size() for p in model.parameters())
    live += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    live += sum(b.numel() * b.element_size() for b in model.buffers())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step(model, opt, *inputs)
    total = peak = 0
    for e in sorted(prof.profiler.function_events, key=lambda e: e.time_range.start):
        total += e.self_cpu_memory_usage
        peak = max(peak, total)
    return live + peak


def imported_module(factory_file, factory, init, threads):
    """The module that `factory` of FILE.py builds (as tools/torch_export.py took it), with the
    weights the exporter wrote to `init` loaded, its optimizer (AdamW, lr 1e-3, no decay), on
    `threads` PyTorch threads: the PyTorch side of the benchmarks of imported modules."""
    import importlib.util
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "tests", "parity"))
    from gpt_reference import read_safetensors
    spec = importlib.util.spec_from_file_location("bench_factory", factory_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.set_num_threads(threads)
    model = getattr(mod, factory)()
    weights, _ = read_safetensors(init)
    model.load_state_dict({k: v for k, v in weights.items() if k in model.state_dict()},
                          strict=False)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)


def blas_core():
    """The kernels OpenBLAS chose in this process (PyTorch's BLAS here is OpenBLAS)."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("vocab", 256), ("layers", 4), ("heads", 4), ("dim", 128), ("seq", 64), ("batch", 16),
                          ("steps", 20), ("warmup", 3), ("threads", 1)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint around every block")
    p.add_argument("--autocast", action="store_true",
                   help='mixed precision: forward under torch.autocast("cpu", dtype=torch.bfloat16)')
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.vocab, a.seq, a.layers, a.heads, a.dim)
    model.checkpoint = a.checkpoint
    global AUTOCAST
    AUTOCAST = a.autocast
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    targets = torch.randint(0, a.vocab, (a.batch, a.seq))
    for _ in range(a.warmup):
        step(model, opt, ids, targets)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step(model, opt, ids, targets)
        times.append(time.perf_counter() - t0)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({"framework": "pytorch " + torch.__version__, "threads": a.threads, "checkpoint": a.checkpoint,
                      "autocast": a.autocast,
                      "tokens_per_s": a.batch * a.seq / median, "step_ms_median": median * 1e3,
                      "peak_tensor_bytes": peak_step_bytes(model, opt, ids, targets),
                      "blas": blas_core()}))


if __name__ == "__main__":
    main()
