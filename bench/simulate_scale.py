#!/usr/bin/env python3
"""`sluice simulate` and `sluice schedule --format json` at scale: wall time, CPU time and peak
RSS (GNU time) for 1F1B at P = 256, 512, 1024 with M = 8P, beside the machine's load.

Usage: bench/simulate_scale.py [--sluice build/sluice] [--before OLD] [--sizes 256,512,1024]
                               [--out scale.json]
Prints one markdown table and writes the figures as JSON. simulate runs `--layers P --batch M`
(the smallest model with a layer per stage); schedule writes its JSON to /dev/null. With
--before, a second binary (e.g. built from an older commit) runs each measurement right before
the first, so that both see the same load; its rows are marked "before". On a busy machine wall
time counts the waits for a core: compare CPU (user + sys) time, and quote `uptime`.
"""
import argparse
import json
import os
import re
import subprocess
import sys


def measure(cmd):
    """Runs cmd under /usr/bin/time -v; returns wall s, cpu s, max RSS MB and the last stdout line."""
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")

    def field(name):
        return re.search(rf"{re.escape(name)}: (.*)", r.stderr).group(1).strip()

    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")
    wall_s = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall)))
    cpu_s = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    rss_mb = int(field("Maximum resident set size (kbytes)")) / 1024
    return {"wall_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2), "rss_mb": round(rss_mb)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--before", default=None, help="another sluice binary, measured alongside")
    ap.add_argument("--sizes", default="256,512,1024", help="stage counts P (M = 8P)")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rows = []
    binaries = ([("before", args.before)] if args.before else []) + [("", args.sluice)]
    for p in (int(x) for x in args.sizes.split(",")):
        m = 8 * p
        for label, binary in binaries:
            sim = measure([binary, "simulate", "--stages", str(p), "--microbatches", str(m),
                           "--layers", str(p), "--batch", str(m), "--schedule", "1f1b",
                           "--format", "json"])
            sched = measure(["sh", "-c", f"'{binary}' schedule --stages {p} "
                             f"--microbatches {m} --schedule 1f1b --format json > /dev/null"])
            rows.append({"P": p, "M": m, "binary": label or "this", "simulate": sim,
                         "schedule_json": sched})
    print(f"load average at start: {load:.1f}, at end: {os.getloadavg()[0]:.1f}\n")
    print("| P | M | binary | simulate wall | simulate CPU | simulate RSS "
          "| schedule --format json wall | CPU | RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, j = r["simulate"], r["schedule_json"]
        print(f"| {r['P']} | {r['M']} | {r['binary']} | {s['wall_s']} s | {s['cpu_s']} s "
              f"| {s['rss_mb']} MB | {j['wall_s']} s | {j['cpu_s']} s | {j['rss_mb']} MB |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"load_average": load, "load_average_at_end": os.getloadavg()[0],
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
