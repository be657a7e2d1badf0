#!/usr/bin/env python3
"""Optimizer post-validation measured: `sluice train` of zb-h2 and zb-v (and 1f1b for contrast) at
P = 2 and 4, with and without --post-validate — steps per second, each stage's measured bubble,
rollbacks counted, the optimizer update's span in the trace (eager or not), and how often a
stage began a step before every stage had ended the previous one (interlocked steps: the
summary's post_validation.overlapped_starts) — beside
the simulator's prediction (`sluice simulate --costs` of the run's own profile: the synchronous
step, and with --post-validate the steady state of interlocked steps) and the share of the step a
stage thread waited for a core (the simulator models a core per stage; P = 4 on a 2-core machine
does not have one).

Usage: bench/post_validation.py [--sluice build/sluice] [--out post_validation.jsonl]
                                [--stages 2,4] [--steps 6] [--clip 10] [--repeat 1]
                                [--schedules 1f1b,zb-h2,zb-v] [--comm mpi [--mpirun mpirun]]
                                [--baseline OTHER/sluice]
Prints one markdown table; writes every run's figures as JSON lines. A GPT of 8 blocks, C = 128,
8 sequences per micro-batch, M = 2P (zb-v needs M ≥ 2P − 1), --threads P (a BLAS thread per stage).
With --repeat N every pair (off, on) runs N times alternately and the table gives the medians: the
machine's load moves between runs, and alternating spreads it over both sides. With --comm mpi
every training run is `mpirun -np P sluice train --comm mpi` (a process per stage, --threads 1
each; the environment of tests/CMakeLists.txt: shared memory, oversubscription allowed), and
"overlapped starts" counts the steps a rank began before the previous step's reduction had
completed on it. With --baseline, another build's --post-validate runs alternate with them (rows
"on (baseline)"): a change to the post-validation path measured against the build before it,
under the same load.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SCHEDULES = ["1f1b", "zb-h2", "zb-v"]
MB_SIZE = 8


MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_btl": "self,vader",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def model(steps, clip, threads):
    return ["--layers", "8", "--dim", "128", "--heads", "4", "--threads", str(threads), "--steps",
            str(steps), "--eval-every", "0", "--quiet", "--clip", str(clip)]


def update_ms(trace):
    """The median span of a stage's optimizer update in the traced steps (the last two): each
    stage's step has two OPT spans, finishing the gradients and then the update (eager or not)."""
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    opt = {}
    for e in sorted((e for e in events if e.get("ph") == "X" and e["name"] == "OPT"),
                    key=lambda e: e["ts"]):
        opt.setdefault(e["pid"], []).append(e["dur"] / 1000)
    spans = sorted(v[i + 1] for v in opt.values() for i in range(0, len(v) - 1, 2))
    return spans[len(spans) // 2] if spans else None


def run(sluice, schedule, p, m, steps, clip, post_validate, tmp, mpirun=None):
    metrics, costs = os.path.join(tmp, "m.jsonl"), os.path.join(tmp, "costs.json")
    job = [*model(steps, clip, 1 if mpirun else p), "--batch", str(MB_SIZE * m),
           "--microbatches", str(m), "--stages", str(p), "--schedule", schedule] + (
               ["--post-validate"] if post_validate else [])
    trace = os.path.join(tmp, "trace.json")
    train = [sluice, "train", *job, "--metrics", metrics, "--profile-out", costs, "--trace", trace]
    if mpirun:
        train = [mpirun, "-np", str(p), sluice, "train", "--comm", "mpi", *train[2:]]
    subprocess.run(train, check=True, env={**os.environ, **MPI_ENV} if mpirun else None,
                   stderr=subprocess.DEVNULL if mpirun else None)
    with open(metrics) as f:
        summary = [json.loads(l) for l in f if '"summary"' in l][-1]
    sim = subprocess.run([sluice, "simulate", *job, "--costs", costs, "--format", "json"],
                         check=True, capture_output=True, text=True)
    sim = json.loads(sim.stdout)
    pv = summary.get("post_validation") or {}
    return {
        "schedule": schedule, "stages": p, "micro_batches": m, "post_validate": post_validate,
        "build": sluice,
        "steps_per_s": steps / summary["wall_s"],
        "measured_bubble": [s["bubble"] for s in summary["stages"]],
        "rollbacks": pv.get("rollbacks"), "rollback_bytes": pv.get("rollback_bytes"),
        "overlapped_starts": pv.get("overlapped_starts"),
        "predicted_step_ms": sim["step_ms"], "predicted_bubble": sim["bubble"],
        "steady_state": sim.get("post_validation"),
        "update_ms": update_ms(trace),
        "core_wait_share": sim.get("core_wait_share"),
        "command": ("mpirun -np {} sluice train --comm mpi ".format(p) if mpirun
                    else "sluice train ") + " ".join(job),
    }


def median_row(runs):
    """The run whose steps/s is the median of `runs` (its other figures with it)."""
    ordered = sorted(runs, key=lambda r: r["steps_per_s"])
    return ordered[len(ordered) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--out", default="post_validation.jsonl")
    ap.add_argument("--stages", default="2,4")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--clip", type=float, default=10.0,
                    help="10: rarely fires (no rollback); 1.0 fires at every step of this job")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--comm", choices=["local", "mpi"], default="local")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--baseline", default=None,
                    help="another sluice whose --post-validate runs alternate with these")
    a = ap.parse_args()
    # (label, binary, post_validate) of each kind of run, in the order they alternate.
    kinds = [("off", a.sluice, False), ("on", a.sluice, True)]
    if a.baseline:
        kinds.append(("on (baseline)", a.baseline, True))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in [int(x) for x in a.stages.split(",")]:
            for schedule in a.schedules.split(","):
                runs = {label: [] for label, _, _ in kinds}
                for _ in range(a.repeat):
                    for label, sluice, post_validate in kinds:
                        runs[label].append(run(sluice, schedule, p, 2 * p, a.steps, a.clip,
                                               post_validate, tmp,
                                               a.mpirun if a.comm == "mpi" else None))
                        runs[label][-1]["kind"] = label
                        print(json.dumps(runs[label][-1]), file=sys.stderr)
                for label, _, _ in kinds:
                    rows.append(median_row(runs[label]))
    with open(a.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print("| schedule | P | M | post-validate | steps/s | measured bubble (mean) | rollbacks "
          "| overlapped starts | update ms (trace) | predicted bubble (sync step) "
          "| predicted steady-state bubble | core wait |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        steady = r["steady_state"]
        cw = r["core_wait_share"]
        cells = [r["schedule"], str(r["stages"]), str(r["micro_batches"]),
                 r["kind"], f"{r['steps_per_s']:.2f}",
                 f"{sum(r['measured_bubble']) / len(r['measured_bubble']):.3f}",
                 str(r["rollbacks"]) if r["rollbacks"] is not None else "-",
                 str(r["overlapped_starts"]) if r["overlapped_starts"] is not None else "-",
                 f"{r['update_ms']:.2f}" if r["update_ms"] is not None else "-",
                 f"{r['predicted_bubble']:.3f}",
                 f"{steady['steady_state_bubble']:.3f}" if steady else "-",
                 f"{cw:.2f}" if cw is not None else "-"]
        print("| " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
