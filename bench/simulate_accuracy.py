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

With --draws N, each schedule is also predicted from its own costs by N replays of costs drawn from
the profile's recorded computes (`sluice simulate --draws N`), both draw modes: "steps" (draw d
replays recorded step d, every compute its own micro-batch's time in that step) and "computes"
(every compute drawn at random from its rank, chunk and kind), beside the replay of medians. The
"steps" replay with one draw per recorded step is also compared step by step with the run: each
recorded step's replay against that step's measured span and bubbles (what the model misses
when it has every compute's own time).

The profile says how long each stage thread waited for a core (other work on the machine): the
"core wait" column is the largest stage's mean wait over the median step. The model gives every
stage a core of its own; a run whose threads waited measured another machine (docs/simulator.md,
"Accuracy"). With --realtime the profiled runs' threads run under SCHED_FIFO (`chrt -f 10`, which
needs CAP_SYS_NICE): each stage thread then takes a core from the machine's other work as soon as
it is ready — a core per stage on a loaded machine, the case the accuracy targets are for. The
per-step comparison also reports the steps in which no stage waited for a core more than 5% of
the step ("quiet steps").

With --cores N, each schedule is also predicted from its own costs with the stage threads sharing
N cores (`sluice simulate --cores`: computes wait for a free core and cost their CPU time) — the
model of an oversubscribed run such as P = 4 on 2 cores.

Usage: /usr/bin/python3 bench/simulate_accuracy.py [--build build] [--stages 2] [--steps 30]
       [--microbatches 8] [--schedules gpipe,1f1b,zb-h1,zb-h2,interleaved] [--cores N] [--realtime]
"self" and "cross" are what `sluice simulate` predicts by default: the mean of draws of the recorded
computes where a profile recorded them (docs/simulator.md), the replay of the medians otherwise.

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
    p.add_argument("--draws", type=int, default=0,
                   help="also predict by this many draws of the recorded computes (simulate --draws)")
    p.add_argument("--realtime", action="store_true",
                   help="run the profiled trainings under SCHED_FIFO (chrt -f 10): a core per stage thread")
    p.add_argument("--model", default="--layers 4 --dim 128 --heads 4 --seq 64 --vocab 256 --batch 16",
                   help="model options of sluice train")
    a = p.parse_args()
    sluice = os.path.join(a.build, "sluice")
    work = tempfile.mkdtemp()
    data = os.path.join(work, "data.txt")  # bytes: .bin would be read as uint16 token ids
    with open(data, "wb") as f:
        f.write(bytes((i * 7919) % 251 for i in range(1 << 18)))
    job = f"{a.model} --data {data} --threads 1 --stages {a.stages} --microbatches {a.microbatches}"
    schedules = a.schedules.split(",")
    load_before = os.getloadavg()[0]

    measured, costs = {}, {}
    for s in schedules:
        path = os.path.join(work, f"{s}.json")
        run(f"{'chrt -f 10 ' if a.realtime else ''}{sluice} train {job} --schedule {s} --steps {a.steps} --eval-every 0 --quiet --profile-out {path}")
        costs[s] = path
        with open(path) as f:
            measured[s] = json.load(f)["measured"]

    def simulate(schedule, costs_files, cores=0, extra=""):
        args = " ".join(f"--costs {c}" for c in costs_files)
        return json.loads(run(f"{sluice} simulate {job} --schedule {schedule} {args} --cores {cores} "
                              f"{extra} --format json"))

    def median(v):
        v = sorted(v)
        n = len(v)
        return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

    def drawn(s, mode, draws, m):
        """Errors of a prediction by draws: of the draws' mean and of their median."""
        j = simulate(s, [costs[s]], extra=f"--draws {draws} --draw-mode {mode}")
        mb = m["stage_bubble"]
        d = j["drawn"]
        med_step = median([x["step_ms"] for x in d])
        med_bubble = [median([x["stage_bubble"][i] for x in d]) for i in range(len(mb))]
        return {"step_ms": j["step_ms"], "error": j["step_ms"] / m["step_ms"] - 1,
                "bubble_error": max(abs(st["bubble"] - b) for st, b in zip(j["stages"], mb)),
                "bubble_signed": [st["bubble"] - b for st, b in zip(j["stages"], mb)],
                "median_error": med_step / m["step_ms"] - 1,
                "median_bubble_error": max(abs(p - b) for p, b in zip(med_bubble, mb)),
                # the standard error of the draws' mean step, relative: how far another seed moves it
                "mean_step_stderr": (sum((x["step_ms"] - j["step_ms"]) ** 2 for x in d) / (len(d) - 1)) ** 0.5
                / len(d) ** 0.5 / j["step_ms"] if len(d) > 1 else 0}

    def means(s, m):
        """The replay of the recorded computes' means instead of their medians (no draws)."""
        with open(costs[s]) as f:
            c = json.load(f)
        rec = c.pop("steps", [])
        if not rec:
            return None
        for r, rank in enumerate(c["ranks"]):
            for v, ch in enumerate(rank["chunks"]):
                for key in ("forward_ms", "backward_ms", "weight_ms"):
                    x = [y for st in rec for y in st["ranks"][r]["chunks"][v][key]]
                    ch[key] = sum(x) / len(x)
            for key in ("optimizer_ms", "update_ms"):
                rank[key] = sum(st["ranks"][r][key] for st in rec) / len(rec)
        path = os.path.join(work, f"{s}.means.json")
        with open(path, "w") as f:
            json.dump(c, f)
        j = simulate(s, [path])
        mb = m["stage_bubble"]
        return {"step_ms": j["step_ms"], "error": j["step_ms"] / m["step_ms"] - 1,
                "bubble_error": max(abs(st["bubble"] - b) for st, b in zip(j["stages"], mb))}

    def per_step(s):
        """Each recorded step replayed with its own computes beside what the run measured of it."""
        with open(costs[s]) as f:
            rec = json.load(f).get("steps", [])
        if not rec:
            return None
        j = simulate(s, [costs[s]], extra=f"--draws {len(rec)} --draw-mode steps")
        span_err = [d["makespan_ms"] / r["span_ms"] - 1 for d, r in zip(j["drawn"], rec)]
        bub_err = [p - b for d, r in zip(j["drawn"], rec) for p, b in zip(d["stage_bubble"], r["stage_bubble"])]
        # Steps in which no stage thread waited for a core more than 5% of the step's span.
        quiet = [i for i, r in enumerate(rec)
                 if all(0 <= x.get("core_wait_ms", -1) <= 0.05 * r["span_ms"] for x in r["ranks"])]
        quiet_err = [span_err[i] for i in quiet]
        quiet_bub = [p - b for i in quiet
                     for p, b in zip(j["drawn"][i]["stage_bubble"], rec[i]["stage_bubble"])]
        return {"steps": len(rec), "span_error_mean": sum(span_err) / len(span_err),
                "span_error_median": median(span_err),
                "bubble_error_mean": sum(bub_err) / len(bub_err),
                "bubble_error_abs_mean": sum(abs(x) for x in bub_err) / len(bub_err),
                "quiet_steps": len(quiet),
                "quiet_span_error_mean": sum(quiet_err) / len(quiet_err) if quiet else None,
                "quiet_bubble_error_mean": sum(quiet_bub) / len(quiet_bub) if quiet else None}

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
        if a.draws:
            rows_draws = {mode: drawn(s, mode, a.draws, m) for mode in ("steps", "computes")}
            med = simulate(s, [costs[s]], extra="--draws 0")
            rows_draws["medians"] = {
                "step_ms": med["step_ms"], "error": med["step_ms"] / m["step_ms"] - 1,
                "bubble_error": max(abs(st["bubble"] - b) for st, b in zip(med["stages"], m["stage_bubble"]))}
            rows_draws["per_step"] = per_step(s)
            rows_draws["means"] = means(s, m)
        rows.append({
            "schedule": s, "measured_step_ms": m["step_ms"],
            "self_step_ms": own["step_ms"], "self_error": own["step_ms"] / m["step_ms"] - 1,
            "self_bubble_error": max(abs(st["bubble"] - b) for st, b in zip(own["stages"], mb)),
            "cross_step_ms": cross["step_ms"], "cross_error": cross["step_ms"] / m["step_ms"] - 1,
            "measured_bubble": mb, "self_bubble": [st["bubble"] for st in own["stages"]],
            "shared_cores_step_ms": on_cores,
            "shared_cores_error": on_cores / m["step_ms"] - 1 if on_cores else None,
            "self_bubble_signed": [st["bubble"] - b for st, b in zip(own["stages"], mb)],
            "core_wait_share": own.get("core_wait_share"),
        })
        if a.draws:
            rows[-1]["draws"] = rows_draws
    load_after = os.getloadavg()[0]

    by_measure = [r["schedule"] for r in sorted(rows, key=lambda r: r["measured_step_ms"])]
    by_cross = [r["schedule"] for r in sorted(rows, key=lambda r: r["cross_step_ms"])]
    print(f"P={a.stages} M={a.microbatches} {a.model} --threads 1, {a.steps} steps each"
          f"{', SCHED_FIFO' if a.realtime else ''}; "
          f"load average {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} cores")
    print(f"{'schedule':<12} {'measured ms':>11} {'self ms':>9} {'err':>7} {'bubble err':>10} "
          f"{'cross ms':>9} {'err':>7} {'core wait':>9}" +
          (f" {f'{a.cores} cores ms':>12} {'err':>7}" if a.cores else ""))
    for r in rows:
        cw = r["core_wait_share"]
        print(f"{r['schedule']:<12} {r['measured_step_ms']:>11.3f} {r['self_step_ms']:>9.3f} "
              f"{100 * r['self_error']:>6.1f}% {r['self_bubble_error']:>10.3f} {r['cross_step_ms']:>9.3f} "
              f"{100 * r['cross_error']:>6.1f}% {'-' if cw is None else f'{100 * cw:.1f}%':>9}" +
              (f" {r['shared_cores_step_ms']:>12.3f} {100 * r['shared_cores_error']:>6.1f}%" if a.cores else ""))
    if a.draws:
        print(f"{a.draws} draws of the recorded computes (mean of draws; median of draws in brackets):")
        print(f"{'schedule':<12} {'medians err':>11} {'bubble':>7} {'steps err':>16} {'bubble':>14} "
              f"{'computes err':>16} {'bubble':>14} {'per-step span err':>17} {'bubble':>7} "
              f"{'quiet steps: err':>16} {'bubble':>7} {'means err':>9} {'bubble':>7}")
        for r in rows:
            d = r["draws"]
            ps = d["per_step"]
            md = d["medians"]
            cells = [f"{100 * md['error']:>10.1f}% {md['bubble_error']:>7.3f}"]
            for mode in ("steps", "computes"):
                x = d[mode]
                cells.append(f"{100 * x['error']:>6.1f}% ({100 * x['median_error']:>5.1f}%) "
                             f"{x['bubble_error']:>6.3f} ({x['median_bubble_error']:.3f})")
            cells.append(f"{100 * ps['span_error_mean']:>16.1f}% {ps['bubble_error_mean']:>+7.3f}" if ps else "-")
            cells.append(f"{ps['quiet_steps']:>3}: {100 * ps['quiet_span_error_mean']:>9.1f}% "
                         f"{ps['quiet_bubble_error_mean']:>+7.3f}" if ps and ps["quiet_steps"] else
                         f"{'0':>3}: {'-':>10} {'-':>7}")
            mn = d["means"]
            cells.append(f"{100 * mn['error']:>8.1f}% {mn['bubble_error']:>7.3f}" if mn else "-")
            print(f"{r['schedule']:<12} " + " ".join(cells))
    print(f"ranking measured: {', '.join(by_measure)}")
    print(f"ranking predicted from one profile: {', '.join(by_cross)}")
    print(json.dumps({"bench": "simulate_accuracy", "stages": a.stages, "microbatches": a.microbatches,
                      "realtime": a.realtime,
                      "load": [load_before, load_after], "cores": os.cpu_count(), "rows": rows,
                      "ranking_measured": by_measure, "ranking_predicted": by_cross}))


if __name__ == "__main__":
    main()
