#!/usr/bin/python3
"""An imported PyTorch module trained by sluice against PyTorch training that very module.

The Llama-style model of tests/parity/torch_models.py (RMSNorm, rotary tables as buffers,
grouped-query attention, SwiGLU, tied embeddings) — or, with --model encoder, its Encoder of
nn.TransformerEncoderLayer (pre-norm, GELU, causal) with dropout --dropout (0.1, PyTorch's
default: attention weights, feed-forward, both residual branches), or with --model lstm_lm its
LSTM language model (embeddings of --dim, an nn.LSTM of --layers layers and hidden size --dim,
unrolled over --seq steps) — at benchmark sizes is exported with tools/torch_export.py, then, for each thread count, trained one after the other by
  sluice    `sluice train --program model.sluice --init-from init.safetensors` on a text file of
            random bytes (vocabulary 256), one micro-batch per step, AdamW;
  PyTorch   this script again (--torch-side), eager PyTorch 1.13 on the same module and weights,
            AdamW, random tokens, gradients released between steps.
Both report tokens/s of the median of --steps timed steps after --warmup steps (and the best
step), and the peak tensor memory of a training step: sluice's allocator peak of requested
bytes (beside `sluice plan`'s forecast); PyTorch's live parameter, optimizer-state and buffer
bytes plus the profiler's highest running total
(bench/torch_train.py peak_step_bytes, the method of docs/benchmarks.md "Training vs PyTorch").
OPENBLAS_NUM_THREADS is set to the thread count for both (PyTorch's set_num_threads does not reach
OpenBLAS).

Run: /usr/bin/python3 bench/torch_import_bench.py [--sluice build/sluice] [--threads 1,2]
     [--steps 20 --warmup 3 --batch 16 --seq 64 --dim 128 --layers 4]
     /usr/bin/python3 bench/torch_import_bench.py --model lstm_lm --dim 256 --layers 2 --threads 1
Prints a table and one JSON object per row.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def model_factory_file(tmp, a):
    """A FILE.py whose `llama` and `encoder` factories build the parity models at the benchmark's
    sizes."""
    path = os.path.join(tmp, "bench_llama.py")
    with open(path, "w") as f:
        f.write(f"""import sys
sys.path.insert(0, {os.path.join(ROOT, 'tests', 'parity')!r})
import torch
from torch_models import Encoder, Llama, LstmLM


def llama():
    torch.manual_seed(0)
    return Llama(vocab=256, seq={a.seq}, dim={a.dim}, heads={a.heads}, kv_heads={a.kv_heads},
                 hidden={a.hidden}, layers={a.layers})


def encoder():
    torch.manual_seed(0)
    return Encoder(vocab=256, seq={a.seq}, dim={a.dim}, heads={a.heads}, layers={a.layers},
                   dropout={a.dropout})


def lstm_lm():
    torch.manual_seed(0)
    return LstmLM(vocab=256, dim={a.dim}, hidden={a.dim}, layers={a.layers})
""")
    return path


def sluice_side(a, exported, data, threads, tmp):
    metrics = os.path.join(tmp, f"metrics_{threads}.jsonl")
    job = ["--program", os.path.join(exported, "model.sluice"),
           "--init-from", os.path.join(exported, "init.safetensors"), "--data", data,
           "--seq", str(a.seq), "--batch", str(a.batch), "--microbatches", "1",
           "--threads", str(threads)]
    cmd = [a.sluice, "train"] + job + [
        "--steps", str(a.warmup + a.steps), "--eval-every", "0", "--eval-batches", "1",
        "--metrics", metrics, "--quiet"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
    plan = subprocess.run([a.sluice, "plan"] + job + ["--format", "json"], check=True,
                          capture_output=True, text=True, env=env)
    subprocess.run(cmd, check=True, env=env)
    steps, summary = [], None
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if "step_ms" in record:
                steps.append(record)
            elif "peak_allocated_bytes" in record and "config" in record:
                summary = record
    timed = sorted(r["step_ms"] for r in steps[a.warmup:])
    median = timed[len(timed) // 2]
    return {"tokens_per_s": a.batch * a.seq / (median / 1e3), "step_ms_median": median,
            "step_ms_best": timed[0], "peak_tensor_bytes": summary["peak_allocated_bytes"],
            "plan_bytes": json.loads(plan.stdout)["stages"][0]["predicted_peak_allocated_bytes"]}


def torch_side(a):
    """Runs in its own process, so that OPENBLAS_NUM_THREADS applies before torch loads."""
    import torch
    sys.path.insert(0, HERE)
    from torch_train import imported_module, peak_step_bytes, step
    model, opt = imported_module(a.factory_file, a.model, a.init, a.torch_side)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (a.batch, a.seq), generator=gen)
    targets = torch.randint(0, 256, (a.batch, a.seq), generator=gen)
    import time
    for _ in range(a.warmup):
        step(model, opt, ids, targets)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step(model, opt, ids, targets)
        times.append(time.perf_counter() - t0)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({"tokens_per_s": a.batch * a.seq / median, "step_ms_median": median * 1e3,
                      "step_ms_best": times[0] * 1e3,
                      "peak_tensor_bytes": peak_step_bytes(model, opt, ids, targets)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--model", choices=("llama", "encoder", "lstm_lm"), default="llama")
    p.add_argument("--dropout", type=float, default=0.1, help="the encoder's dropout")
    for name, default in (("steps", 20), ("warmup", 3), ("batch", 16), ("seq", 64), ("dim", 128),
                          ("heads", 4), ("kv_heads", 2), ("hidden", 384), ("layers", 4)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--torch-side", type=int, help=argparse.SUPPRESS)  # internal: thread count
    p.add_argument("--factory-file", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.torch_side:
        torch_side(a)
        return 0
    with tempfile.TemporaryDirectory(prefix="torch_import_bench.") as tmp:
        factory = model_factory_file(tmp, a)
        exported = os.path.join(tmp, a.model)
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "torch_export.py"),
                        f"{factory}:{a.model}", "--batch", str(a.batch), "--seq", str(a.seq),
                        "--out", exported], check=True, stdout=subprocess.DEVNULL)
        data = os.path.join(tmp, "random.txt")
        with open(data, "wb") as f:
            f.write(os.urandom(1 << 20))
        rows = []
        for threads in (int(t) for t in a.threads.split(",")):
            s = sluice_side(a, exported, data, threads, tmp)
            out = subprocess.run(
                [sys.executable, __file__, "--torch-side", str(threads), "--factory-file", factory,
                 "--init", os.path.join(exported, "init.safetensors")] +
                [f"--{k}={getattr(a, k)}" for k in ("steps", "warmup", "batch", "seq", "model")],
                check=True, capture_output=True, text=True,
                env=dict(os.environ, OPENBLAS_NUM_THREADS=str(threads)))
            t = json.loads(out.stdout.strip().splitlines()[-1])
            model = {"encoder": f"encoder, dropout {a.dropout:g} (imported)",
                     "lstm_lm": "lstm_lm (imported, unrolled)"}.get(a.model, "llama (imported)")
            rows.append({"model": model, "threads": threads, "sluice": s, "pytorch": t,
                         "speed_ratio": s["tokens_per_s"] / t["tokens_per_s"],
                         "memory_ratio": s["peak_tensor_bytes"] / t["peak_tensor_bytes"]})
        print("| threads | sluice tok/s | PyTorch tok/s | ratio | sluice peak MB (plan) | "
              "PyTorch peak MB | ratio |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            s = r["sluice"]
            plan = ("= plan" if s["plan_bytes"] == s["peak_tensor_bytes"]
                    else f"plan {s['plan_bytes'] / 1e6:.1f}")
            print(f"| {r['threads']} | {s['tokens_per_s']:,.0f} | "
                  f"{r['pytorch']['tokens_per_s']:,.0f} | {r['speed_ratio']:.2f} | "
                  f"{s['peak_tensor_bytes'] / 1e6:.1f} ({plan}) | "
                  f"{r['pytorch']['peak_tensor_bytes'] / 1e6:.1f} | {r['memory_ratio']:.2f} |")
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
