#!/usr/bin/python3
"""How right `sluice simulate` is: predicted step time and bubble beside measured runs.

For each schedule, one `sluice train --profile-out` run measures its costs and its own step time
and per-stage bubble (medians over the steps after the first). Then:
  self   `sluice simulate --costs` of that schedule with its own costs vs what the run measured:
         the model's error with perfect costs.
  cross  every schedule predicted from ONE profile (zb-h1's, which covers gpipe, 1f1b, zb-h1 and
         zb-h2; interleaved needs its own) vs its own measured run: what a user choosing a
         schedule before running it gets; the ranking by prediction beside the ranking by
         measurement (`sluice simulate --compare`).
Timing depends on the machine: the accuracy targets (±10% step time, ±0.03 bubble) are for one
core per stage thread on a quiet machine; the script prints the load average beside its figures.

With --cores N, each schedule is also predicted from its own costs with the stage threads sharing
N cores (`sluice simulate --cores`: computes wait for a free core and cost their CPU time) — the
model of an oversubscribed run such as P = 4 on 2 cores.

Usage: /usr/bin/python3 bench/simulate_accuracy.py [--build build] [--stages 2] [--steps 30]
       [--microbatches 8] [--schedules gpipe,1f1b,zb-h1,zb-h2,interleaved] [--cores N]
Prints a table and one JSON line.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(cmd):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {cmd}\n{r.stderr}")
    return r.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--schedules", default="gpipe,1f1b,zb-h1,zb-h2,interleaved")
    p.add_argument("--cores", type=int, default=0,
                   help="also predict with the stage threads sharing this many cores (simulate --cores)")
    p.add_argument("--model", default="--layers 4 --dim 128 --heads 4 --seq 64 --vocab 256 --batch 16",
                   help="model options of sluice train")
    a = p.parse_args()
    sluice = os.path.join(a.build, "sluice")
    work = tempfile.mkdtemp()
    data = os.path.join(work, "data.bin")
    with open(data, "wb") as f:
        f.write(bytes((i * 7919) % 251 for i in range(1 << 18)))
    job = f"{a.model} --data {data} --threads 1 --stages {a.stages} --microbatches {a.microbatches}"
    schedules = a.schedules.split(",")
    load_before = os.getloadavg()[0]

    measured, costs = {}, {}
    for s in schedules:
        path = os.path.join(work, f"{s}.json")
        run(f"{sluice} train {job} --schedule {s} --steps {a.steps} --eval-every 0 --quiet --profile-out {path}")
        costs[s] = path
        with open(path) as f:
            measured[s] = json.load(f)["measured"]

    def simulate(schedule, costs_files, cores=0):
        args = " ".join(f"--costs {c}" for c in costs_files)
        return json.loads(run(f"{sluice} simulate {job} --schedule {schedule} {args} --cores {cores} --format json"))

    rows = []
    shared = [costs["zb-h1"]] if "zb-h1" in costs else []
    if "interleaved" in costs:
        shared.append(costs["interleaved"])
    for s in schedules:
        own = simulate(s, [costs[s]])
        cross = simulate(s, shared) if shared else own
        m = measured[s]
        mb = m["stage_bubble"]
        on_cores = simulate(s, [costs[s]], a.cores)["step_ms"] if a.cores else None
        rows.append({
            "schedule": s, "measured_step_ms": m["step_ms"],
            "self_step_ms": own["step_ms"], "self_error": own["step_ms"] / m["step_ms"] - 1,
            "self_bubble_error": max(abs(st["bubble"] - b) for st, b in zip(own["stages"], mb)),
            "cross_step_ms": cross["step_ms"], "cross_error": cross["step_ms"] / m["step_ms"] - 1,
            "measured_bubble": mb, "self_bubble": [st["bubble"] for st in own["stages"]],
            "shared_cores_step_ms": on_cores,
            "shared_cores_error": on_cores / m["step_ms"] - 1 if on_cores else None,
        })
    load_after = os.getloadavg()[0]

    by_measure = [r["schedule"] for r in sorted(rows, key=lambda r: r["measured_step_ms"])]
    by_cross = [r["schedule"] for r in sorted(rows, key=lambda r: r["cross_step_ms"])]
    print(f"P={a.stages} M={a.microbatches} {a.model} --threads 1, {a.steps} steps each; "
          f"load average {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} cores")
    print(f"{'schedule':<12} {'measured ms':>11} {'self ms':>9} {'err':>7} {'bubble err':>10} "
          f"{'cross ms':>9} {'err':>7}" + (f" {f'{a.cores} cores ms':>12} {'err':>7}" if a.cores else ""))
    for r in rows:
        print(f"{r['schedule']:<12} {r['measured_step_ms']:>11.3f} {r['self_step_ms']:>9.3f} "
              f"{100 * r['self_error']:>6.1f}% {r['self_bubble_error']:>10.3f} {r['cross_step_ms']:>9.3f} "
              f"{100 * r['cross_error']:>6.1f}%" +
              (f" {r['shared_cores_step_ms']:>12.3f} {100 * r['shared_cores_error']:>6.1f}%" if a.cores else ""))
    print(f"ranking measured: {', '.join(by_measure)}")
    print(f"ranking predicted from one profile: {', '.join(by_cross)}")
    print(json.dumps({"bench": "simulate_accuracy", "stages": a.stages, "microbatches": a.microbatches,
                      "load": [load_before, load_after], "cores": os.cpu_count(), "rows": rows,
                      "ranking_measured": by_measure, "ranking_predicted": by_cross}))


if __name__ == "__main__":
    main()
