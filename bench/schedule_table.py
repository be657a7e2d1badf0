#!/usr/bin/env python3
"""Every pipeline schedule at P = 2 and 4, M = 4, 8 and 16: the bubble and in-flight figures of
the schedule analysis (`sluice schedule --format json`, unit cost) beside what `sluice train`
measures (its metrics summary: per-stage bubble, in-flight peak and allocator peak).

Usage: bench/schedule_table.py [--sluice build/sluice] [--out schedule_table.jsonl]
                               [--schedules 1f1b,v-min,...] [--stages 2,4]
Prints one markdown table; writes every run's figures as JSON lines. A GPT of 8 blocks, C = 256,
8 sequences per micro-batch, 3 steps, --threads 2 (P = 2: one core per stage on a 2-core machine;
P = 4 oversubscribes). Takes ~10 minutes on 2 busy cores.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min"]
MODEL = ["--layers", "8", "--dim", "256", "--heads", "4", "--threads", "2", "--steps", "3",
         "--eval-every", "0", "--quiet"]
MB_SIZE = 8


def theory(sluice, schedule, p, m):
    r = subprocess.run([sluice, "schedule", "-p", str(p), "-m", str(m), "-s", schedule,
                        "--format", "json"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip().removeprefix("sluice: error: ")
    j = json.loads(r.stdout)
    return {"bubble": j["bubble"], "in_flight": [x["in_flight_peak"] for x in j["ranks"]]}, None


def measure(sluice, schedule, p, m, metrics):
    cmd = [sluice, "train", *MODEL, "--batch", str(MB_SIZE * m), "--microbatches", str(m),
           "--stages", str(p), "--schedule", schedule, "--metrics", metrics]
    subprocess.run(cmd, check=True)
    with open(metrics) as f:
        summary = [json.loads(l) for l in f if '"summary"' in l][-1]
    stages = summary["stages"]
    return {"bubble": [s["bubble"] for s in stages],
            "in_flight": [s["inflight_peak"] for s in stages],
            "theoretical_in_flight": [s["theoretical_inflight"] for s in stages],
            "peak_bytes": [s["peak_allocated_bytes"] for s in stages],
            "command": " ".join(cmd[1:-2])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--out", default="schedule_table.jsonl")
    ap.add_argument("--schedules", default=",".join(SCHEDULES), help="comma list (default: all)")
    ap.add_argument("--stages", default="2,4", help="comma list of P")
    a = ap.parse_args()
    schedules = a.schedules.split(",")
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown:
        ap.error(f"unknown schedule(s) {', '.join(unknown)}; known: {', '.join(SCHEDULES)}")
    stages = [int(p) for p in a.stages.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, open(a.out, "w") as out:
        for p in stages:
            for schedule in schedules:
                for m in (4, 8, 16):
                    t, why = theory(a.sluice, schedule, p, m)
                    row = {"schedule": schedule, "P": p, "M": m, "theory": t, "refused": why}
                    if t is not None:
                        row["measured"] = measure(a.sluice, schedule, p, m,
                                                  os.path.join(tmp, "m.jsonl"))
                    out.write(json.dumps(row) + "\n")
                    rows.append(row)
                    print(f"{schedule} P={p} M={m} done", file=sys.stderr)
    print("| schedule | P | M | bubble: theory | measured, mean (per stage) | in flight per stage "
          "(= theory) | peak per stage, MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        head = f"| {r['schedule']} | {r['P']} | {r['M']} |"
        if r["theory"] is None:
            print(f"{head} — | refused: {r['refused'].split(':', 1)[-1].strip()} | | |")
            continue
        ms = r["measured"]
        mean = sum(ms["bubble"]) / len(ms["bubble"])
        same = ms["in_flight"] == ms["theoretical_in_flight"] == r["theory"]["in_flight"]
        print(f"{head} {r['theory']['bubble']:.3f} | {mean:.3f} "
              f"({' '.join(f'{b:.2f}' for b in ms['bubble'])}) | "
              f"{' '.join(map(str, ms['in_flight']))}{'' if same else ' (differs!)'} | "
              f"{' '.join(f'{b / 2**20:.1f}' for b in ms['peak_bytes'])} |")


if __name__ == "__main__":
    main()
