#!/usr/bin/python3
"""Memory you can budget, measured (docs/memory.md; figures in docs/benchmarks.md).

GPT V=256 L=4 H=4 C=128 T=64, AdamW, --threads 1, random bytes as data. The budget of each case is
the no-recompute peak (per stage) of the job at batch 16; the largest batch that `sluice plan
--memory-budget` says fits is then trained with `sluice train --memory-budget` and its measured
peaks and tokens/s are set beside the unbudgeted batch-16 run:
  pipeline-micro   4 stages 1f1b, 8 micro-batches: the micro-batch grows with the batch
  pipeline-accum   4 stages 1f1b, micro-batches of 2 sequences: the number of micro-batches grows
  one-stage        no pipeline, one micro-batch
  one-stage-accum  no pipeline, micro-batches of 16 sequences (gradients accumulated in place)
Then one stage beside PyTorch 1.13 (bench/torch_train.py) in the same session: batch 16 without
and with torch.utils.checkpoint per block, batch 48 with it (against --recompute full, also with
the unfused head and with gradients added apart, to show what each lever takes off).

Usage: /usr/bin/python3 bench/memory_budget.py [--build build] [--steps 12]
Prints a table per case and one JSON line per case.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

MODEL = "--vocab 256 --seq 64 --layers 4 --heads 4 --dim 128 --threads 1 --eval-every 0 --quiet"


def run(cmd):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True)


def summary(metrics):
    with open(metrics) as f:
        return [json.loads(line) for line in f if '"summary":true' in line][-1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=12)
    a = p.parse_args()
    sluice = os.path.join(a.build, "sluice")
    work = tempfile.mkdtemp()
    data = os.path.join(work, "data.txt")  # bytes: .bin would be read as tokens
    random.seed(0)
    with open(data, "wb") as f:
        f.write(bytes(random.randrange(256) for _ in range(1 << 20)))
    base = f"{sluice} {{cmd}} --data {data} {MODEL}"

    every = (24, 32, 40, 48, 56, 64, 80, 96, 128)
    cases = [
        ("pipeline-micro", "--stages 4 --schedule 1f1b --microbatches 8", lambda b: f"--batch {b}", every),
        ("pipeline-accum", "--stages 4 --schedule 1f1b",
         lambda b: f"--batch {b} --microbatches {b // 2}", every),
        ("one-stage", "", lambda b: f"--batch {b} --microbatches 1", every),
        ("one-stage-accum", "", lambda b: f"--batch {b} --microbatches {b // 16}", (32, 48, 64, 80, 96, 128)),
    ]
    for name, job, size, batches in cases:
        plan = run(base.format(cmd="plan") + f" {job} {size(16)} --recompute none --format json")
        if plan.returncode != 0:
            sys.exit(f"{name}: sluice plan failed: {plan.stderr}")
        budget = [s["predicted_peak_allocated_bytes"] for s in json.loads(plan.stdout)["stages"]]
        budget_arg = ",".join(str(b) for b in budget)
        largest, policies = 16, None
        for batch in batches:
            fit = run(base.format(cmd="plan") + f" {job} {size(batch)} --memory-budget {budget_arg} --format json")
            if fit.returncode != 0:
                break
            largest = batch
            policies = [s["recompute"] for s in json.loads(fit.stdout)["stages"]]
        free_m, budget_m = os.path.join(work, "free.jsonl"), os.path.join(work, "budget.jsonl")
        r1 = run(base.format(cmd="train") + f" {job} {size(16)} --recompute none --steps {a.steps} --metrics {free_m}")
        r2 = run(base.format(cmd="train") + f" {job} {size(largest)} --memory-budget {budget_arg} --steps {a.steps} --metrics {budget_m}")
        if r1.returncode or r2.returncode:
            sys.exit(f"{name}: training failed: {r1.stderr}{r2.stderr}")
        free, budgeted = summary(free_m), summary(budget_m)
        stages = free.get("stages") or [free]
        stages_b = budgeted.get("stages") or [budgeted]
        within = all(s["peak_allocated_bytes"] <= b for s, b in zip(stages_b, budget))
        print(f"\n{name}: budget = no-recompute peaks of batch 16; largest batch within it {largest} "
              f"(recompute {','.join(policies) if policies else 'none'})")
        print(f"{'stage':<6} {'budget B':>10} {'batch 16 peak':>14} {f'batch {largest} peak':>15}")
        for s, (b, f, g) in enumerate(zip(budget, stages, stages_b)):
            print(f"{s:<6} {b:>10} {f['peak_allocated_bytes']:>14} {g['peak_allocated_bytes']:>15}")
        ratio = budgeted["tokens_per_s"] / free["tokens_per_s"]
        print(f"batch {largest / 16:.2f}x, tokens/s {free['tokens_per_s']:.0f} -> {budgeted['tokens_per_s']:.0f} "
              f"({ratio:.2f}x), every stage within budget: {within}")
        print(json.dumps({"bench": "memory_budget", "case": name, "budget": budget, "largest_batch": largest,
                          "policies": policies, "batch_ratio": largest / 16, "tokens_per_s_ratio": ratio,
                          "within_budget": within}))

    # One stage beside PyTorch: batch 16 without recompute / checkpointing and with it, and batch
    # 48 with it (the issue-34 target: at most 0.8x PyTorch's checkpointing; --recompute sublayer
    # recomputes a block one sub-layer at a time, full the whole block at once).
    # "sluice ... unfused head" shows what the chunked head (--head-chunk) takes off.
    print(f"\n{'one stage':<40} {'tokens/s':>10} {'peak tensor B':>14} {'vs PyTorch':>11}")
    rows = []
    for batch, policy, extra, label in (
            (16, "none", "", "no recompute"),
            (16, "full", "", "--recompute full"),
            (16, "sublayer", "", "--recompute sublayer"),
            (48, "full", "", "--recompute full"),
            (48, "sublayer", "", "--recompute sublayer"),
            (48, "full", "--head-chunk -1", "--recompute full, unfused head"),
            (48, "full", "--no-accumulate-in-place", "--recompute full, gradients added apart")):
        m = os.path.join(work, f"one_{batch}_{policy}_{len(rows)}.jsonl")
        r = run(base.format(cmd="train") + f" --batch {batch} --microbatches 1 --steps {a.steps} "
                f"--recompute {policy} {extra} --metrics {m}")
        if r.returncode:
            sys.exit(r.stderr)
        s = summary(m)
        rows.append((batch, policy != "none", f"sluice b{batch} {label}", s["tokens_per_s"],
                     s["peak_allocated_bytes"]))
    torch = {}
    for batch in (16, 48):
        for ckpt in ("", "--checkpoint"):
            r = run(f"/usr/bin/python3 bench/torch_train.py --threads 1 --batch {batch} "
                    f"--steps {a.steps - 2} {ckpt}")
            if r.returncode:
                sys.exit(r.stderr)
            t = json.loads(r.stdout)
            torch[(batch, bool(ckpt))] = t["peak_tensor_bytes"]
            rows.append((batch, bool(ckpt), f"pytorch b{batch} " + ("checkpoint per block" if ckpt else "plain"),
                         t["tokens_per_s"], t["peak_tensor_bytes"]))
    for batch, ckpt, label, tps, peak in rows:
        print(f"{label:<40} {tps:>10.0f} {peak:>14} {peak / torch[(batch, ckpt)]:>10.2f}x")
    print(json.dumps({"bench": "memory_budget_one_stage",
                      "rows": [{"what": l, "batch": b, "tokens_per_s": t, "peak_tensor_bytes": p,
                                "vs_pytorch": p / torch[(b, c)]} for b, c, l, t, p in rows]}))

if __name__ == "__main__":
    main()
