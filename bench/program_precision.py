#!/usr/bin/python3
"""`--precision bf16` against fp32 on programs imported from PyTorch (tools/torch_export.py).

The GPT and the Llama-style model of tests/parity/torch_models.py at benchmark sizes (vocabulary
256, T = 64, C = 128, 4 layers, 4 heads; the Llama 2 key/value heads and a SwiGLU of 384) are
exported, then each is planned and trained at batch 16, one micro-batch, no recompute, AdamW, on a
text file of random bytes, fp32 and bf16 (the program's autocast form, ir/autocast.h):
  plan      `sluice plan ... --format json`: the forecast peak (predicted_peak_allocated_bytes);
  train     `sluice train ... --metrics`: the measured peak (peak_allocated_bytes) and tokens/s of
            the median of --steps timed steps after --warmup, fp32 and bf16 alternately for
            --rounds rounds (the machine is shared: each ratio is of medians over the rounds).
Prints a table and one JSON object per row.

Run: /usr/bin/python3 bench/program_precision.py [--sluice build/sluice] [--threads 1]
     [--rounds 3 --steps 10 --warmup 2] [--sluice-flags=--no-in-place]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

FACTORIES = """import sys
sys.path.insert(0, {parity!r})
import torch
from torch_models import GPT, Llama


def gpt():
    torch.manual_seed(0)
    return GPT(vocab=256, seq=64, dim=128, heads=4, layers=4)


def llama():
    torch.manual_seed(0)
    return Llama(vocab=256, seq=64, dim=128, heads=4, kv_heads=2, hidden=384, layers=4)
"""


def job(a, exported, data, precision):
    return ["--program", os.path.join(exported, "model.sluice"), "--init-from",
            os.path.join(exported, "init.safetensors"), "--data", data, "--seq", "64",
            "--batch", "16", "--microbatches", "1", "--no-recompute", "--threads", str(a.threads),
            "--precision", precision] + a.sluice_flags.split()


def plan(a, exported, data, precision):
    out = subprocess.run([a.sluice, "plan"] + job(a, exported, data, precision) +
                         ["--format", "json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["stages"][0]["predicted_peak_allocated_bytes"]


def train(a, exported, data, precision, metrics):
    subprocess.run([a.sluice, "train"] + job(a, exported, data, precision) +
                   ["--steps", str(a.warmup + a.steps), "--eval-every", "0", "--eval-batches", "1",
                    "--metrics", metrics, "--quiet"], check=True,
                   env=dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads)))
    steps, summary = [], None
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if "step_ms" in record:
                steps.append(record["step_ms"])
            elif record.get("summary"):
                summary = record
    median = statistics.median(steps[a.warmup:])
    return {"tokens_per_s": 16 * 64 / (median / 1e3), "peak": summary["peak_allocated_bytes"],
            "f32_ops": summary.get("precision", {}).get("f32_ops")}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sluice-flags", default="",
                   help="more flags for sluice train and plan, e.g. --no-in-place")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="program_precision.") as tmp:
        factories = os.path.join(tmp, "bench_models.py")
        with open(factories, "w") as f:
            f.write(FACTORIES.format(parity=os.path.join(ROOT, "tests", "parity")))
        data = os.path.join(tmp, "random.txt")
        with open(data, "wb") as f:
            f.write(os.urandom(1 << 20))
        for model in ("gpt", "llama"):
            exported = os.path.join(tmp, model)
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "torch_export.py"),
                            f"{factories}:{model}", "--batch", "16", "--seq", "64", "--out",
                            exported], check=True, stdout=subprocess.DEVNULL)
            row = {"model": model + " (imported)", "threads": a.threads}
            runs = {"fp32": [], "bf16": []}
            for precision in runs:
                row[f"plan_{precision}"] = plan(a, exported, data, precision)
            for r in range(a.rounds):
                for precision in runs:
                    runs[precision].append(train(a, exported, data, precision,
                                                 os.path.join(tmp, f"{model}_{precision}_{r}.jsonl")))
            for precision, rs in runs.items():
                row[f"tokens_per_s_{precision}"] = statistics.median(x["tokens_per_s"] for x in rs)
                row[f"peak_{precision}"] = rs[0]["peak"]
            row["f32_ops"] = runs["bf16"][0]["f32_ops"]
            row["speed_ratio"] = row["tokens_per_s_bf16"] / row["tokens_per_s_fp32"]
            row["peak_ratio"] = row["peak_bf16"] / row["peak_fp32"]
            rows.append(row)
    print("| model | threads | fp32 peak (plan = measured) | bf16 peak (plan = measured) | bf16 / fp32 "
          "| fp32 tok/s | bf16 tok/s | bf16 / fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        def peak(p):
            same = "=" if r[f"plan_{p}"] == r[f"peak_{p}"] else f"≠ {r[f'plan_{p}']:,}"
            return f"{r[f'peak_{p}']:,} B ({same})"
        print(f"| {r['model']} | {r['threads']} | {peak('fp32')} | {peak('bf16')} | "
              f"{r['peak_ratio']:.3f} | {r['tokens_per_s_fp32']:,.0f} | "
              f"{r['tokens_per_s_bf16']:,.0f} | {r['speed_ratio']:.2f} |")
    for r in rows:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
