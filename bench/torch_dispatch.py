#!/usr/bin/python3
"""PyTorch eager on the loop bench/exec_bench.cc's BM_Dispatch interprets: a chain of 10,000 adds
on 64-float tensors (y = y + c), one thread, no autograd. Prints one JSON object per variant with
the median ns per op over --repeats timed chains (after one warm-up chain), in wall time and in
CPU time of the process (the fairer figure on a machine shared with other work).

Run: /usr/bin/python3 bench/torch_dispatch.py [--ops 10000] [--size 64] [--repeats 20]
Compare ns_per_op with BM_Dispatch's ns_per_instruction (docs/benchmarks.md, "Executor").
"""
import argparse
import json
import platform
import statistics
import time

import torch


def chain(y, c, ops, out_of_place):
    if out_of_place:
        for _ in range(ops):
            y = y + c          # allocates a fresh tensor per op, like the interpreter
    else:
        for _ in range(ops):
            y.add_(c)          # in place: dispatch without allocation
    return y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    c = torch.rand(args.size)
    for variant, out_of_place in (("out_of_place", True), ("in_place", False)):
        with torch.no_grad():
            chain(torch.rand(args.size), c, args.ops, out_of_place)  # warm-up
            times, cpu_times = [], []
            for _ in range(args.repeats):
                y = torch.rand(args.size)
                start, cpu_start = time.perf_counter_ns(), time.process_time_ns()
                chain(y, c, args.ops, out_of_place)
                times.append(time.perf_counter_ns() - start)
                cpu_times.append(time.process_time_ns() - cpu_start)
        print(json.dumps({
            "benchmark": "torch_dispatch",
            "variant": variant,
            "ops": args.ops,
            "size": args.size,
            "repeats": args.repeats,
            "ns_per_op_median": statistics.median(times) / args.ops,
            "ns_per_op_min": min(times) / args.ops,
            "cpu_ns_per_op_median": statistics.median(cpu_times) / args.ops,
            "torch": torch.__version__,
            "python": platform.python_version(),
        }))


if __name__ == "__main__":
    main()
