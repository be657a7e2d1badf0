#!/usr/bin/python3
"""The defaults against their alternatives: what a user gets without a flag, side by side.

For each job a user runs without flags (the default `sluice train`; pipelines of 2, 4 and 8 stages
in fp32 and bf16 — 4 and 8 stage threads outnumber this VM's 2 cores; the example programs; a GPT
imported from PyTorch; bench/cnn_bench.py's CNN and ResNet-8 on 1, 2 and 4 stages) the default
run and each alternative to one of its defaults (intra-op threads, GC mode, schedule, bf16 engine,
f32 convolution engine, the OMP_WAIT_POLICY restart of cli/main.cc) run one after the other,
and the order rotates each round, so that every variant meets the machine's load alike. Per run:
tokens (or examples) per second of the whole run (the summary's figure: tokens / wall, start-up
included), the process's CPU seconds (user + system: load disturbs it less than wall time) and
each stage's peak allocated bytes. Per variant: the median and best over rounds, and the ratios to
the default's medians. With `--masked`, the bf16 jobs also run with AMX masked
(ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16: the `packed` engine becomes the default) against oneDNN's
AVX512_BF16 products.

Run: /usr/bin/python3 bench/defaults.py [--sluice build/sluice] [--rounds 3] [--jobs REGEX]
     [--masked] [--log runs.jsonl]
Prints the load average before and after, a table per job, and one JSON object per variant.
Figures: docs/benchmarks.md, "Defaults on 2 cores".
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEXT = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt")

# The GPT of the pipeline jobs (bench/gc_modes.sh's job): L=4 (8 at P=8), H=4, C=128, T=64, batch 16.
GPT = ["--heads", "4", "--dim", "128", "--seq", "64", "--batch", "16"]
NO_RESTART = {"SLUICE_NO_RESTART": "1"}
MASKED = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}

IMPORTED_GPT = """import sys
sys.path.insert(0, {parity!r})
import torch
from torch_models import GPT


def gpt():
    torch.manual_seed(0)
    return GPT(vocab=256, seq=64, dim=128, heads=4, layers=4)
"""


def jobs(data, imported, masked, convnets="CONVNETS"):
    """[(job, base arguments, [(variant, extra arguments, extra environment)])]; the first
    variant of each job is the default."""
    out = [("default", ["--steps", "300"],
            [("default", [], {}), ("--threads 1", ["--threads", "1"], {}),
             ("--gc async", ["--gc", "async"], {}), ("no restart", [], NO_RESTART)])]
    for precision in ("fp32", "bf16"):
        for p in (1, 2, 4, 8) if precision == "bf16" else (2, 4, 8):
            base = ["--data", data, "--layers", str(max(4, p))] + GPT + ["--steps", "30"]
            if p > 1: base += ["--stages", str(p)]
            if precision == "bf16": base += ["--precision", "bf16"]
            variants = [("default", [], {}), ("no restart", [], NO_RESTART),
                        ("--gc async", ["--gc", "async"], {})]
            # Intra-op threads: the default shares the cores among the stages (at least 1 each);
            # the alternative gives each of 2 stages 2 (4 or 8 stages at 2 threads each take
            # minutes a run: docs/benchmarks.md, "Defaults on 2 cores").
            if p == 2: variants.append(("2 threads a stage", ["--threads", str(2 * p)], {}))
            if p == 1: variants.append(("--threads 1", ["--threads", "1"], {}))
            if p > 1: variants.append(("--schedule zb-h1", ["--schedule", "zb-h1"], {}))
            if precision == "bf16":
                variants.append(("packed engine", [], {"SLUICE_BF16_GEMM": "packed"}))
                if masked:
                    variants.append(("AMX masked (packed)", [], MASKED))
                    variants.append(("AMX masked, onednn", [], dict(MASKED, SLUICE_BF16_GEMM="onednn")))
            out.append((f"{precision} P={p}", base, variants))
    for name, extra in (("classifier.sluice", ["--data", "blobs", "--steps", "1000"]),
                        ("prenorm.sluice", ["--data", "sort", "--steps", "300"]),
                        ("tied_lm.sluice", ["--data", "sort", "--steps", "200", "--stages", "4",
                                            "--layout", "embed|block.0|block.1|head"])):
        out.append((name, ["--program", os.path.join(ROOT, "examples", name)] + extra,
                    [("default", [], {}), ("--threads 1", ["--threads", "1"], {}),
                     ("--gc async", ["--gc", "async"], {}), ("no restart", [], NO_RESTART)]))
    for precision in ("fp32", "bf16"):
        out.append((f"imported GPT {precision}",
                    ["--program", os.path.join(imported, "model.sluice"), "--init-from",
                     os.path.join(imported, "init.safetensors"), "--data", data, "--seq", "64",
                     "--batch", "16", "--steps", "20", "--precision", precision],
                    [("default", [], {}), ("--threads 1", ["--threads", "1"], {}),
                     ("--gc async", ["--gc", "async"], {}), ("no restart", [], NO_RESTART)]))
    # The convolutional networks of bench/cnn_bench.py (imported, batch 32) on 1, 2 and 4 stages
    # (4 stage threads outnumber the cores): the f32 convolutions' default engine against im2col.
    for model in ("cnn", "resnet8"):
        for p in (1, 2, 4):
            base = ["--program", os.path.join(convnets, model, "model.sluice"), "--init-from",
                    os.path.join(convnets, model, "init.safetensors"), "--data",
                    os.path.join(convnets, "images.safetensors"), "--batch", "32", "--steps", "40"]
            if p > 1: base += ["--stages", str(p), "--microbatches", "4"]
            out.append((f"{model} P={p}", base,
                        [("default", [], {}), ("im2col", [], {"SLUICE_CONV": "im2col"})]))
    return out


def export_convnets(directory):
    """bench/cnn_bench.py's CNN and ResNet-8, exported at batch 32, and its random images."""
    sys.path.insert(0, HERE)
    import cnn_bench
    factory = os.path.join(directory, "convnets.py")
    with open(factory, "w") as f:
        f.write(cnn_bench.FACTORY)
    images = os.path.join(directory, "images.safetensors")
    cnn_bench.write_images(images, 256)
    for model in ("cnn", "resnet8"):
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "torch_export.py"),
                        f"{factory}:{model}", "--batch", "32", "--data", images, "--out",
                        os.path.join(directory, model)], check=True, stdout=subprocess.DEVNULL)


def run(sluice, args, env, metrics):
    """One training run: (summary, CPU seconds of the process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("OMP_WAIT_POLICY", "SLUICE_NO_RESTART", "SLUICE_BF16_GEMM",
                             "ONEDNN_MAX_CPU_ISA", "SLUICE_GEMM", "SLUICE_CONV")}
    full_env.update(env)
    subprocess.run([sluice, "train", *args, "--eval-every", "0", "--quiet", "--metrics", metrics],
                   check=True, env=full_env, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(metrics) as f:
        summary = next(j for j in map(json.loads, f) if j.get("summary"))
    return summary, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", default=".", help="a regular expression the job names must match")
    parser.add_argument("--masked", action="store_true", help="bf16 jobs with AMX masked too")
    parser.add_argument("--log", help="a file for one JSON line per run, as it ends")
    parser.add_argument("--summarize", metavar="RUNS.jsonl",
                        help="no runs: the tables of the runs a --log file holds")
    a = parser.parse_args()
    data = TEXT if os.path.exists(TEXT) else "sort"
    if a.summarize:
        results = {}
        with open(a.summarize) as f:
            for j in map(json.loads, f):
                results.setdefault((j["job"], j["variant"]), []).append((j["summary"], j["cpu_s"]))
        todo = [j for j in jobs(data, "IMPORTED", a.masked) if re.search(a.jobs, j[0])]
        return report(todo, results)
    with tempfile.TemporaryDirectory() as tmp:
        factory = os.path.join(tmp, "imported_gpt.py")
        with open(factory, "w") as f:
            f.write(IMPORTED_GPT.format(parity=os.path.join(ROOT, "tests", "parity")))
        imported = os.path.join(tmp, "igpt")
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "torch_export.py"),
                        f"{factory}:gpt", "--batch", "8", "--seq", "64", "--out", imported],
                       check=True, stdout=subprocess.DEVNULL)
        todo = [j for j in jobs(data, imported, a.masked, tmp) if re.search(a.jobs, j[0])]
        if any(job.startswith(("cnn", "resnet8")) for job, _, _ in todo):
            export_convnets(tmp)
        flags = sorted({w for line in open("/proc/cpuinfo") if line.startswith("flags")
                        for w in line.split()[2:] if w.startswith(("avx512", "amx"))})
        print(f"machine: {os.cpu_count()} cores, flags {' '.join(flags)}")
        print(f"load before: {open('/proc/loadavg').read().split()[:3]}; {a.rounds} rounds; "
              f"data {data}", flush=True)
        results = {}  # (job, variant) -> [(summary, cpu)]
        log = open(a.log, "w") if a.log else open(os.devnull, "w")
        for r in range(a.rounds):
            for job, base, variants in todo:
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for name, extra, env in order:
                    metrics = os.path.join(tmp, "m.jsonl")
                    summary, cpu = run(a.sluice, base + extra, env, metrics)
                    results.setdefault((job, name), []).append((summary, cpu))
                    print(json.dumps({"run": r, "job": job, "variant": name, "cpu_s": round(cpu, 3),
                                      "summary": summary}), file=log, flush=True)
            print(f"round {r + 1} done, load {open('/proc/loadavg').read().split()[:3]}", flush=True)
        print(f"load after: {open('/proc/loadavg').read().split()[:3]}")
        report(todo, results)


def report(todo, results):
    """The table per job and one JSON object per variant, from results[(job, variant)]."""
    rows = []
    for job, base, variants in todo:
        if (job, variants[0][0]) not in results: continue
        print(f"\n{job}: sluice train {' '.join(base)}")
        print(f"  {'variant':<22} {'rate median':>11} {'best':>9} {'vs default':>10} "
              f"{'CPU s':>6} {'vs default':>10}  peak allocated B (largest stage)  resolved")
        default = None
        for name, extra, env in variants:
            runs = results.get((job, name))
            if not runs: continue
            rate_key = "tokens_per_s" if "tokens_per_s" in runs[0][0] else "examples_per_s"
            rates = [s[rate_key] for s, _ in runs]
            cpus = [c for _, c in runs]
            peak = max(max(st["peak_allocated_bytes"] for st in s.get("stages", [s]))
                       for s, _ in runs)
            k = runs[0][0].get("kernels", {})
            resolved = f"gc {runs[0][0]['gc']}"
            if "bf16_gemm" in k: resolved += f", {k['bf16_gemm']}"
            if "omp_wait_policy" in k: resolved += f", OMP {k['omp_wait_policy']}"
            row = {"job": job, "variant": name, "args": base + extra, "env": env,
                   "rate": rate_key, "rate_median": statistics.median(rates),
                   "rate_best": max(rates), "rates": [round(x) for x in rates],
                   "cpu_s_median": statistics.median(cpus), "cpu_s": [round(c, 2) for c in cpus],
                   "peak_allocated_bytes": peak, "resolved": resolved}
            default = default or row
            row["rate_vs_default"] = row["rate_median"] / default["rate_median"]
            row["cpu_vs_default"] = row["cpu_s_median"] / default["cpu_s_median"]
            rows.append(row)
            print(f"  {name:<22} {row['rate_median']:>11,.0f} {row['rate_best']:>9,.0f} "
                  f"{row['rate_vs_default']:>10.2f} {row['cpu_s_median']:>6.2f} "
                  f"{row['cpu_vs_default']:>10.2f}  {peak:>14,}  {resolved}")
    print()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    sys.exit(main())
