#!/usr/bin/python3
"""A small convolutional network imported from PyTorch, trained by sluice and by PyTorch side by side.

The model (--model cnn, BenchCNN below) is a CIFAR-sized classifier: images [B, 3, 32, 32], four
3x3 convolutions of 16, 32, 64 and 64 channels (padding 1, ReLU), a 2x2 max pool after the second
and third and a 2x2 average pool after the fourth, a linear head to 10 classes; or (--model
resnet8, ResNet8 below) a CIFAR ResNet-8: a 3x3 stem of 16 channels and three basic blocks of 16,
32 and 64 channels (the last two strided, with strided 1x1 shortcuts), every convolution followed
by BatchNorm2d in training mode, AdaptiveAvgPool2d(1), a linear head; or (--model mobilenet,
MobileNet below) a CIFAR MobileNetV2: a 3x3 stem of 16 channels and four inverted residual blocks
(1x1 expansion by 6, 3x3 depthwise Conv2d with groups = channels, the first of each pair strided,
1x1 projection, BatchNorm2d and ReLU6) of 24, 24, 32 and 32 channels, pooling, a linear head. It
is exported with
tools/torch_export.py; both sides train it from the same initial weights on the same random images
(examples/classifier_data.py's file layout), one micro-batch per step, AdamW, for each thread count:
  sluice    `sluice train --program model.sluice --init-from init.safetensors --threads N`
            (OPENBLAS_NUM_THREADS=N): examples/s of the median of --steps timed steps after
            --warmup; CPU time per timed step (the run's user + system time less a run of the
            warm-up steps alone: on a loaded machine the steadier figure); the peak of allocated tensor bytes (the metrics' summary) and the forecast
            (`sluice plan`, predicted_peak_allocated_bytes); the process's peak RSS (getrusage).
  PyTorch   this script again (--torch-side N), eager PyTorch 1.13 with torch.set_num_threads(N)
            (its convolutions are oneDNN's): examples/s likewise; CPU time per timed step
            (time.process_time); the peak tensor bytes of a step
            as bench/torch_train.py's peak_step_bytes measures them (live parameters and optimizer
            state plus the profiler's highest running total); the process's peak RSS, and its RSS
            once torch is imported (the interpreter and libraries before any tensor).
sluice and PyTorch alternate for --rounds rounds per thread count (the machine is shared); each
figure is the median over the rounds.

Run: /usr/bin/python3 bench/cnn_bench.py [--model cnn|resnet8|mobilenet] [--sluice build/sluice] [--threads 1,2]
     [--rounds 3 --steps 20 --warmup 3 --batch 32] [--sluice-flags=--no-in-place]
Prints a table and one JSON object per row.
"""
import argparse
import json
import os
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZE, CHANNELS, CLASSES = 32, 3, 10

FACTORY = """import torch
import torch.nn as nn
import torch.nn.functional as F


class BenchCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),                         # [B, 16, 32, 32]
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),       # [B, 32, 16, 16]
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),       # [B, 64, 8, 8]
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),       # [B, 64, 4, 4]
            nn.Flatten())
        self.head = nn.Linear(64 * 4 * 4, 10)

    def forward(self, image, label):
        return F.cross_entropy(self.head(self.features(image)), label)


def cnn():
    torch.manual_seed(0)
    return BenchCNN()


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet8(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                          nn.ReLU()),                                          # [B, 16, 32, 32]
            BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2),  # [B, 64, 8, 8]
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(64, 10)

    def forward(self, image, label):
        return F.cross_entropy(self.head(self.layers(image)), label)


def resnet8():
    torch.manual_seed(0)
    return ResNet8()


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand=6):
        super().__init__()
        hidden = cin * expand
        self.shortcut = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.block(x) if self.shortcut else self.block(x)


class MobileNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                          nn.ReLU6()),                                         # [B, 16, 32, 32]
            InvertedResidual(16, 24, 2), InvertedResidual(24, 24, 1),          # [B, 24, 16, 16]
            InvertedResidual(24, 32, 2), InvertedResidual(32, 32, 1),          # [B, 32, 8, 8]
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, 10)

    def forward(self, image, label):
        return F.cross_entropy(self.head(self.layers(image)), label)


def mobilenet():
    torch.manual_seed(0)
    return MobileNet()
"""


def write_images(path, examples, channels=CHANNELS):
    """Random images in [0, 1) and labels, as examples/classifier_data.py writes its arrays."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from classifier_data import write_safetensors
    rng = random.Random(0)
    n = examples * channels * SIZE * SIZE
    write_safetensors(path, {
        "image": ("F32", [examples, channels, SIZE, SIZE],
                  struct.pack(f"<{n}f", *(rng.random() for _ in range(n)))),
        "label": ("I64", [examples], struct.pack(f"<{examples}q",
                                                 *(rng.randrange(CLASSES) for _ in range(examples)))),
    })


def job(a, exported, data, threads):
    return ["--program", os.path.join(exported, "model.sluice"), "--init-from",
            os.path.join(exported, "init.safetensors"), "--data", data, "--batch", str(a.batch),
            "--microbatches", "1", "--threads", str(threads)] + a.sluice_flags.split()


def sluice_plan(a, exported, data, threads):
    out = subprocess.run([a.sluice, "plan"] + job(a, exported, data, threads) + ["--format", "json"],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["stages"][0]["predicted_peak_allocated_bytes"]


def run_sluice(a, exported, data, threads, metrics, steps):
    """Runs `sluice train` for `steps` steps; returns its metrics' records and its rusage."""
    cmd = [a.sluice, "train"] + job(a, exported, data, threads) + [
        "--steps", str(steps), "--eval-every", "0", "--eval-batches", "1", "--metrics", metrics,
        "--quiet"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, OPENBLAS_NUM_THREADS=str(threads)))
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"sluice train failed ({status}): {' '.join(cmd)}")
    with open(metrics) as f:
        return [json.loads(line) for line in f], usage


def sluice_side(a, exported, data, threads, metrics):
    records, usage = run_sluice(a, exported, data, threads, metrics, a.warmup + a.steps)
    # CPU time of the timed steps: the run's less that of a run of the warm-up steps alone.
    _, setup = run_sluice(a, exported, data, threads, metrics + ".warmup", a.warmup)
    cpu_s = (usage.ru_utime + usage.ru_stime) - (setup.ru_utime + setup.ru_stime)
    steps = [r["step_ms"] for r in records if "step_ms" in r]
    summary = next(r for r in records if r.get("summary"))
    median = statistics.median(steps[a.warmup:])
    return {"examples_per_s": a.batch / (median / 1e3), "step_ms_median": median,
            "cpu_ms_per_step": cpu_s * 1e3 / a.steps,
            "peak_tensor_bytes": summary["peak_allocated_bytes"],
            "peak_rss_bytes": usage.ru_maxrss * 1024}


def torch_side(a):
    """Runs in its own process, so that its RSS is its own and OPENBLAS_NUM_THREADS applies."""
    import torch
    rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "tests", "parity"))
    from gpt_reference import read_safetensors
    from torch_train import imported_module, peak_step_bytes, step
    model, opt = imported_module(a.factory_file, a.model, a.init, a.torch_side)
    data, _ = read_safetensors(a.data)
    images, labels = data["image"][:a.batch], data["label"][:a.batch]
    for _ in range(a.warmup):
        step(model, opt, images, labels)
    times = []
    cpu0 = time.process_time()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step(model, opt, images, labels)
        times.append(time.perf_counter() - t0)
    cpu_ms = (time.process_time() - cpu0) * 1e3 / a.steps
    median = statistics.median(times)
    print(json.dumps({"examples_per_s": a.batch / median, "step_ms_median": median * 1e3,
                      "cpu_ms_per_step": cpu_ms,
                      "peak_tensor_bytes": peak_step_bytes(model, opt, images, labels),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "rss_after_import_bytes": rss_import}))


def torch_run(a, factory, exported, data, threads):
    out = subprocess.run(
        [sys.executable, __file__, "--torch-side", str(threads), "--factory-file", factory,
         "--init", os.path.join(exported, "init.safetensors"), "--data-file", data] +
        [f"--{k}={getattr(a, k)}" for k in ("steps", "warmup", "batch", "model")],
        check=True, capture_output=True, text=True,
        env=dict(os.environ, OPENBLAS_NUM_THREADS=str(threads)))
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_of(runs):
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--model", default="cnn", choices=("cnn", "resnet8", "mobilenet"))
    p.add_argument("--sluice-flags", default="",
                   help="more flags for sluice train and plan, e.g. --no-in-place")
    for name, default in (("rounds", 3), ("steps", 20), ("warmup", 3), ("batch", 32)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--torch-side", type=int, help=argparse.SUPPRESS)  # internal: thread count
    p.add_argument("--factory-file", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--data-file", dest="data", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.torch_side:
        torch_side(a)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="cnn_bench.") as tmp:
        factory = os.path.join(tmp, "bench_cnn.py")
        with open(factory, "w") as f:
            f.write(FACTORY)
        data = os.path.join(tmp, "images.safetensors")
        write_images(data, max(256, 4 * a.batch))
        exported = os.path.join(tmp, "cnn")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "torch_export.py"),
                        f"{factory}:{a.model}", "--batch", str(a.batch), "--data", data, "--out",
                        exported], check=True, stdout=subprocess.DEVNULL)
        for threads in (int(t) for t in a.threads.split(",")):
            plan = sluice_plan(a, exported, data, threads)
            s_runs, t_runs = [], []
            for r in range(a.rounds):
                s_runs.append(sluice_side(a, exported, data, threads,
                                          os.path.join(tmp, f"metrics_{threads}_{r}.jsonl")))
                t_runs.append(torch_run(a, factory, exported, data, threads))
            s, t = median_of(s_runs), median_of(t_runs)
            s["plan_bytes"] = plan
            rows.append({"model": f"{a.model} (imported)", "batch": a.batch, "threads": threads,
                         "rounds": a.rounds, "sluice": s, "pytorch": t,
                         "speed_ratio": s["examples_per_s"] / t["examples_per_s"],
                         "cpu_ratio": s["cpu_ms_per_step"] / t["cpu_ms_per_step"],
                         "tensor_memory_ratio": s["peak_tensor_bytes"] / t["peak_tensor_bytes"],
                         "rss_ratio": s["peak_rss_bytes"] / t["peak_rss_bytes"]})
    print("| threads | sluice ex/s | PyTorch ex/s | ratio | CPU ms/step sluice / PyTorch | "
          "sluice peak MB (plan) | PyTorch peak MB | sluice RSS MB | PyTorch RSS MB (after import) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, t = r["sluice"], r["pytorch"]
        plan = "= plan" if s["plan_bytes"] == s["peak_tensor_bytes"] else \
            f"plan {s['plan_bytes'] / 1e6:.2f}"
        print(f"| {r['threads']} | {s['examples_per_s']:,.0f} | {t['examples_per_s']:,.0f} | "
              f"{r['speed_ratio']:.2f} | {s['cpu_ms_per_step']:.1f} / {t['cpu_ms_per_step']:.1f} | "
              f"{s['peak_tensor_bytes'] / 1e6:.2f} ({plan}) | "
              f"{t['peak_tensor_bytes'] / 1e6:.2f} | {s['peak_rss_bytes'] / 1e6:.0f} | "
              f"{t['peak_rss_bytes'] / 1e6:.0f} ({t['rss_after_import_bytes'] / 1e6:.0f}) |")
    for r in rows:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
