#!/usr/bin/python3
"""Per-stage memory of pipeline training beside PyTorch 1.13 with Megatron-style output release.

The PyTorch side is the pipeline a Megatron-LM user runs, written out on plain PyTorch: one process
per stage (gloo over a file rendezvous, one intra-op thread each), the same GPT as sluice's
(bench/torch_train.py's Block), the same layers per stage as sluice's partitioner chose (read from
sluice's metrics summary), AdamW, the 1F1B schedule. Communication follows Megatron's 1F1B (a send
paired with the next receive in steady state); once a send has completed, the output tensor's
storage is swapped for a 1-element one (Megatron's deallocate_output_tensor) and
its backward runs through the autograd engine directly (Megatron's custom_backward), so the
graph lives on without the output's data. "--no-release" keeps outputs until their backward.

Memory is the peak of live tensor bytes during the second training step on each rank: the bytes
live before it (parameters, optimizer state, buffers) plus the highest running total of every
allocation and free the profiler recorded (profile_memory=True), in time order — exact, not per op.
sluice's figure is the same quantity from its allocators (peak_allocated_bytes per stage).

Usage: /usr/bin/python3 bench/torch_pipeline.py [--build build] [--stages 4] [--microbatches 4]
       [--vocab 256 --layers 4 --heads 4 --dim 128 --seq 64 --batch 16]
Prints a table (MB per stage, ratios to PyTorch with release) and one JSON line.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import Block  # noqa: E402  the same block as the one-stage benchmark


def parse_layout(text, layers):
    """sluice's layout text ("embed,h.0|h.1|h.2|h.3,head") as one (embed, blocks, head) per stage."""
    stages = []
    for part in text.split("|"):
        embed, head, blocks = False, False, []
        for item in part.split(","):
            if item == "embed":
                embed = True
            elif item == "head":
                head = True
            elif item.startswith("h."):
                span = item[2:].split("-")
                first, last = int(span[0]), int(span[-1])
                blocks.extend(range(first, last + 1))
            else:
                raise ValueError(f"layout {text!r}: unknown item {item!r}")
        stages.append((embed, blocks, head))
    if sorted(b for _, bl, _ in stages for b in bl) != list(range(layers)):
        raise ValueError(f"layout {text!r} does not hold the {layers} layers once each")
    return stages


class Stage(nn.Module):
    def __init__(self, a, embed, blocks, head):
        super().__init__()
        self.embed, self.head = embed, head
        if embed:
            self.wte, self.wpe = nn.Embedding(a.vocab, a.dim), nn.Embedding(a.seq, a.dim)
        self.h = nn.ModuleList(Block(a.dim, a.heads) for _ in blocks)
        if head:
            self.ln_f = nn.LayerNorm(a.dim)
            self.lm_head = nn.Linear(a.dim, a.vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(a.seq, a.seq, dtype=torch.bool), diagonal=1),
                             persistent=False)

    def forward(self, x, ids, targets, microbatches):
        if self.embed:
            x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for block in self.h:
            x = block(x, self.mask)
        if self.head:
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1)) / microbatches
        return x


def run_backward(output, grad):
    """Backward from an output whose data may have been released (Megatron's custom_backward):
    the engine is called directly, skipping the shape check of torch.autograd.backward."""
    Variable._execution_engine.run_backward(
        tensors=(output,), grad_tensors=(grad,), keep_graph=False, create_graph=False, inputs=tuple(),
        allow_unreachable=True, accumulate_grad=True)


def one_f_one_b(rank, P, M, model, batches, shape, release):
    """One training step's forward and backward passes in 1F1B order on this rank, with the
    communication pattern of Megatron-LM's forward_backward_pipelining_without_interleaving: a
    blocking send in warm-up and cool-down, a send paired with the next receive in steady state
    (posted together, then waited), the output released once its send has completed."""
    first, last = rank == 0, rank == P - 1

    def exchange(send=None, send_to=None, recv_from=None):
        ops, got = [], None
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send, send_to))
        if recv_from is not None:
            got = torch.empty(shape)
            ops.append(dist.P2POp(dist.irecv, got, recv_from))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return got

    def recv_forward():
        return None if first else exchange(recv_from=rank - 1).requires_grad_()

    def forward(i, x):
        ids, targets = batches[i]
        return model(x, ids, targets, M)

    def backward(x, out, grad):
        if last:
            out.backward()
        else:
            run_backward(out, grad)
        return None if first else x.grad

    def release_output(out):
        if release and not last:
            out.data = torch.empty((1,), dtype=out.dtype)  # the storage goes; the graph stays

    warm = min(P - rank - 1, M)
    saved = []
    for i in range(warm):
        x = recv_forward()
        out = forward(i, x)
        exchange(send=None if last else out.detach(), send_to=rank + 1)
        release_output(out)
        saved.append((x, out))
    x = recv_forward() if M > warm else None
    for i in range(M - warm):
        out = forward(warm + i, x)
        grad = None if last else exchange(send=out.detach(), send_to=rank + 1, recv_from=rank + 1)
        release_output(out)
        saved.append((x, out))
        x_b, out_b = saved.pop(0)
        g_in = backward(x_b, out_b, grad)
        del x_b, out_b, grad
        more = i < M - warm - 1
        x = exchange(send=g_in, send_to=rank - 1, recv_from=rank - 1 if more and not first else None)
        if x is not None:
            x.requires_grad_()
    for i in range(warm):
        grad = exchange(recv_from=rank + 1)
        x_b, out_b = saved.pop(0)
        g_in = backward(x_b, out_b, grad)
        del x_b, out_b
        exchange(send=g_in, send_to=rank - 1)


def rank_main(rank, a, layout, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=a.stages)
    torch.manual_seed(rank)
    embed, blocks, head = layout[rank]
    model = Stage(a, embed, blocks, head)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    mb = a.batch // a.microbatches
    batches = [(torch.randint(0, a.vocab, (mb, a.seq), generator=g), torch.randint(0, a.vocab, (mb, a.seq), generator=g))
               for _ in range(a.microbatches)]
    shape = (mb, a.seq, a.dim)

    def step():
        opt.zero_grad(set_to_none=True)
        one_f_one_b(rank, a.stages, a.microbatches, model, batches, shape, not a.no_release)
        opt.step()

    step()  # the first step creates AdamW's state
    dist.barrier()
    live = sum(t.numel() * t.element_size() for t in model.parameters())
    live += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    live += sum(t.numel() * t.element_size() for t in model.buffers())
    with torch.autograd.profiler.profile(profile_memory=True) as prof:
        step()
    records = [e for e in prof.kineto_results.events() if e.name() == "[memory]"]
    records.sort(key=lambda e: e.start_us())
    total = peak = 0
    for e in records:
        total += e.nbytes()
        peak = max(peak, total)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "peak_tensor_bytes": live + peak, "live_before": live}, f)
    dist.barrier()
    dist.destroy_process_group()


def torch_peaks(a, layout, release):
    work = tempfile.mkdtemp()
    b = argparse.Namespace(**vars(a))
    b.no_release = not release
    mp.spawn(rank_main, args=(b, layout, os.path.join(work, "init"), work), nprocs=a.stages, join=True)
    return [json.load(open(os.path.join(work, f"rank{r}.json")))["peak_tensor_bytes"] for r in range(a.stages)]


def sluice_run(a, data, extra):
    work = tempfile.mkdtemp()
    metrics = os.path.join(work, "m.jsonl")
    cmd = (f"{os.path.join(a.build, 'sluice')} train --data {data} --vocab {a.vocab} --seq {a.seq} "
           f"--layers {a.layers} --heads {a.heads} --dim {a.dim} --batch {a.batch} --stages {a.stages} "
           f"--schedule 1f1b --microbatches {a.microbatches} --steps {a.steps} --eval-every 0 --quiet "
           f"--metrics {metrics} {extra}")
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"sluice failed: {cmd}\n{r.stderr}")
    with open(metrics) as f:
        summary = [json.loads(line) for line in f if '"summary":true' in line][-1]
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    for name, default in (("stages", 4), ("microbatches", 4), ("vocab", 256), ("layers", 4), ("heads", 4),
                          ("dim", 128), ("seq", 64), ("batch", 16), ("steps", 4)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    data = os.path.join(tempfile.mkdtemp(), "data.txt")  # raw bytes: a .bin file is read as tokens
    random.seed(0)
    with open(data, "wb") as f:
        f.write(bytes(random.randrange(a.vocab) for _ in range(1 << 18)))

    rows = []
    layout_text = None
    for label, extra in (("sluice, default flags", ""), ("sluice --recompute selective", "--recompute selective"),
                         ("sluice --recompute full", "--recompute full"),
                         ("sluice --recompute sublayer", "--recompute sublayer")):
        s = sluice_run(a, data, extra)
        layout_text = layout_text or s["pipeline"]["layout"]
        rows.append((label, [st["peak_allocated_bytes"] for st in s["stages"]]))
    layout = parse_layout(layout_text, a.layers)
    rows.insert(0, ("pytorch 1F1B + release", torch_peaks(a, layout, release=True)))
    rows.insert(1, ("pytorch 1F1B, no release", torch_peaks(a, layout, release=False)))

    base = rows[0][1]
    print(f"GPT V={a.vocab} L={a.layers} H={a.heads} C={a.dim} T={a.seq} B={a.batch}, {a.stages} stages 1F1B, "
          f"M={a.microbatches}, layout {layout_text}, {torch.__version__}")
    header = " ".join(f"{'stage ' + str(s):>16}" for s in range(a.stages))
    print(f"{'':<30} {header}")
    for label, peaks in rows:
        cells = " ".join(f"{v / 1e6:>7.2f} MB {v / b:>5.2f}x" for v, b in zip(peaks, base))
        print(f"{label:<30} {cells}")
    print(json.dumps({"bench": "torch_pipeline", "layout": layout_text, "stages": a.stages,
                      "microbatches": a.microbatches, "torch": torch.__version__,
                      "rows": [{"what": l, "peak_tensor_bytes": v} for l, v in rows]}))


if __name__ == "__main__":
    main()
