#!/usr/bin/python3
"""Soak: does a long training run hold its memory flat? (issue 13; figures in docs/benchmarks.md)

Trains a small GPT (2 layers, C = 32, 2 heads, the sort task) for --steps steps in 2 pipeline
stages (1F1B, 2 micro-batches, the default GC) with a checkpoint every --save-every steps, and
samples while it runs:
  rss        the process's resident set (VmRSS of /proc/PID/status), every --interval seconds,
             tagged with the last step the metrics file had reached
  checkpoints  the step recorded in the checkpoint each time the file changes (the saves seen)
  reserved   each step's peak_reserved_bytes and peak_allocated_bytes from the metrics JSON lines
             (the caching allocators of both stages)
After the warm-up (the first --warmup-frac of the steps) it fits a least-squares line to each
series against the step and reports the slope in bytes per 1000 steps, with the series' range.
A leak of one 4-byte float per step shows up as 4,000 B / 1000 steps. A run is called flat when the
allocator's slopes are under --flat-bytes and the RSS slope under --flat-rss-bytes per 1000 steps
(RSS moves by whole pages as malloc's arenas and the page cache of the checkpoint writes come and
go, so its threshold is coarser: 64 KiB per 1000 steps is 640 KiB over 10,000 steps).

Usage: /usr/bin/python3 bench/soak.py [--sluice build/sluice] [--steps 10000] [--save-every 500]
Prints a summary and one JSON line; exit 1 if not flat.
"""
import argparse
import json
import os
import subprocess
import sys
import struct
import tempfile
import time


def fit(points):
    """Least-squares slope and intercept of [(x, y)]."""
    n = len(points)
    if n < 2:
        return 0.0, points[0][1] if points else 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    slope = sxy / sxx if sxx else 0.0
    return slope, my - slope * mx


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def last_step(path, state):
    """Reads the metrics lines appended since the last call; returns the last step seen."""
    try:
        with open(path) as f:
            f.seek(state["offset"])
            chunk = f.read()
    except OSError:
        return state["step"]
    complete = chunk[: chunk.rfind("\n") + 1]
    state["offset"] += len(complete.encode())
    for line in complete.splitlines():
        if '"loss"' in line and '"step"' in line and '"summary"' not in line:
            state["step"] = json.loads(line)["step"]
    return state["step"]


def checkpoint_step(path, state):
    """The step of the checkpoint at `path` when it changed since the last call (it is replaced
    by a rename, so a read sees a whole file), else None."""
    try:
        mtime = os.stat(path).st_mtime_ns
        if mtime == state.get("mtime"):
            return None
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        state["mtime"] = mtime
        return int(header["__metadata__"]["step"])
    except (OSError, ValueError, KeyError, struct.error):
        return None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sluice", default="build/sluice")
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--save-every", type=int, default=500)
    p.add_argument("--interval", type=float, default=0.05, help="seconds between RSS samples")
    p.add_argument("--warmup-frac", type=float, default=0.1)
    p.add_argument("--flat-bytes", type=float, default=4096.0,
                   help="largest allocator slope (bytes per 1000 steps) still called flat")
    p.add_argument("--flat-rss-bytes", type=float, default=65536.0,
                   help="largest RSS slope (bytes per 1000 steps) still called flat")
    p.add_argument("--dir", default=None, help="where the metrics and checkpoint go (default: a temp dir)")
    args = p.parse_args()

    workdir = args.dir or tempfile.mkdtemp(prefix="sluice-soak-")
    os.makedirs(workdir, exist_ok=True)
    metrics = os.path.join(workdir, "metrics.jsonl")
    ckpt = os.path.join(workdir, "checkpoint.safetensors")
    cmd = [args.sluice, "train", "--model", "gpt", "--layers", "2", "--dim", "32", "--heads", "2",
           "--batch", "8", "--stages", "2", "--microbatches", "2", "--schedule", "1f1b",
           "--steps", str(args.steps), "--save", ckpt, "--save-every", str(args.save_every),
           "--metrics", metrics, "--quiet"]
    print("$ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd)
    state = {"offset": 0, "step": 0}
    rss = []  # (step, bytes)
    ckpt_state, saved = {}, set()
    while proc.poll() is None:
        r = rss_bytes(proc.pid)
        s = last_step(metrics, state)
        if r is not None and s > 0:
            rss.append((s, r))
        c = checkpoint_step(ckpt, ckpt_state)
        if c is not None:
            saved.add(c)
        time.sleep(args.interval)
    c = checkpoint_step(ckpt, ckpt_state)
    if c is not None:
        saved.add(c)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        print(f"soak: sluice train exited {proc.returncode}", file=sys.stderr)
        return 2

    reserved, allocated, summary = [], [], None
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("summary"):
                summary = rec
            elif "loss" in rec and "peak_reserved_bytes" in rec:
                reserved.append((rec["step"], rec["peak_reserved_bytes"]))
                allocated.append((rec["step"], rec["peak_allocated_bytes"]))

    warm = int(args.steps * args.warmup_frac)
    result = {"steps": args.steps, "save_every": args.save_every, "wall_s": round(wall, 1),
              "warmup_steps": warm, "rss_samples": len(rss)}
    flat = True
    for name, series in (("rss", rss), ("reserved", reserved), ("allocated", allocated)):
        after = [(x, y) for x, y in series if x > warm]
        if len(after) < 2:
            print(f"soak: too few {name} samples after warm-up ({len(after)})", file=sys.stderr)
            return 2
        slope, _ = fit(after)
        ys = [y for _, y in after]
        per_k = slope * 1000.0
        result[name] = {"slope_bytes_per_1000_steps": round(per_k, 1), "min": min(ys),
                        "max": max(ys), "first": ys[0], "last": ys[-1], "samples": len(after)}
        limit = args.flat_rss_bytes if name == "rss" else args.flat_bytes
        flat = flat and abs(per_k) <= limit
        print(f"{name:9s} after step {warm}: {min(ys):>12,} .. {max(ys):>12,} B "
              f"(first {ys[0]:,}, last {ys[-1]:,}), slope {per_k:+,.1f} B / 1000 steps "
              f"over {len(after)} samples")
    result["flat"] = flat
    result["checkpoint_steps_seen"] = sorted(saved)
    result["final_loss"] = summary.get("final_loss") if summary else None
    print(f"wall {wall:.1f} s; checkpoints seen at steps {sorted(saved)}; "
          f"final loss {result['final_loss']}; {'flat' if flat else 'NOT flat'}")
    print(json.dumps(result))
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
