#!/usr/bin/python3
"""Peak memory of imported PyTorch modules against PyTorch's, model by model, batch by batch.

Each model is written in PyTorch, exported once by tools/torch_export.py and trained, at each
batch, by `sluice train --program` (one micro-batch, AdamW, fp32, --threads 1, default flags) and
by eager PyTorch 1.13 (the same module and weights, AdamW, fp32, one thread). Reported per row:
  sluice    `sluice plan`'s forecast (predicted_peak_allocated_bytes) and the measured peak of
            allocated tensor bytes of a --steps-step run (its metrics' summary); the process's
            peak RSS (getrusage);
  PyTorch   the peak tensor bytes of a training step as bench/torch_train.py's peak_step_bytes
            measures them (live parameters, optimizer state and buffers plus the profiler's
            highest running total: the figure of "Training vs PyTorch", which favours PyTorch),
            after --steps - 1 steps; the process's peak RSS, and its RSS once torch is imported;
  and the ratios sluice / PyTorch of tensor bytes and of RSS.
Peaks of tensor bytes do not depend on load (run it under `nice -n 19`).

The models (V 256 for token models, 11 for the padded text, T 64 (--seq), C 128, 4 layers, 4
heads):
  gpt       tests/parity/torch_models.py GPT (nanoGPT: separate bias adds, tied head)
  llama     tests/parity/torch_models.py Llama (RMSNorm, rotary, grouped-query 4/2 heads, SwiGLU)
  bert      tests/parity/torch_classifiers.py BertClassifier on padded text (padding mask)
  encoder   tests/parity/torch_classifiers.py EncoderClassifier (nn.TransformerEncoder, padding
            mask, post-norm, ReLU)
  vit       tests/parity/torch_classifiers.py ViT on 1-channel 32x32 images, patches of 4
  cnn       bench/cnn_bench.py BenchCNN on 3-channel 32x32 images
  resnet8   bench/cnn_bench.py ResNet8 (batch norm in training mode)

Run: nice -n 19 /usr/bin/python3 bench/import_memory.py [--sluice build/sluice]
     [--models gpt,llama,...] [--batches 1,4,16,64,128] [--steps 2] [--seq 64]
     [--sluice-flags=...]
Prints a table and one JSON object per row.
"""
import argparse
import inspect
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import cnn_bench  # noqa: E402 (the CNN factories, the images, the sluice side's commands)

SEQ, DIM, HEADS, LAYERS = 64, 128, 4, 4  # SEQ: --seq's default


def factories(seq):
    """The factory file: cnn_bench's CNN and ResNet-8, and the parity models at benchmark sizes
    (sequences of `seq`)."""
    return cnn_bench.FACTORY + f"""
import sys
sys.path.insert(0, {os.path.join(ROOT, 'tests', 'parity')!r})
import torch_classifiers
import torch_models


def gpt():
    torch.manual_seed(0)
    return torch_models.GPT(vocab=256, seq={seq}, dim={DIM}, heads={HEADS}, layers={LAYERS})


def llama():
    torch.manual_seed(0)
    return torch_models.Llama(vocab=256, seq={seq}, dim={DIM}, heads={HEADS}, kv_heads=2,
                              hidden=384, layers={LAYERS})


def bert():
    torch.manual_seed(0)
    return torch_classifiers.BertClassifier(vocab=11, seq={seq}, dim={DIM}, heads={HEADS},
                                            layers={LAYERS})


def encoder():
    torch.manual_seed(0)
    return torch_classifiers.EncoderClassifier(vocab=11, seq={seq}, dim={DIM}, heads={HEADS},
                                               layers={LAYERS})


def vit():
    torch.manual_seed(0)
    return torch_classifiers.ViT(size=32, patch=4, dim={DIM}, heads={HEADS}, layers={LAYERS},
                                 classes=10)
"""

# model -> its data: "text" (random bytes, --seq), "padded" (examples/padded_text_data.py),
# "rgb" / "gray" (cnn_bench's random images of 3 / 1 channels).
MODELS = {"gpt": "text", "llama": "text", "bert": "padded", "encoder": "padded", "vit": "gray",
          "cnn": "rgb", "resnet8": "rgb"}


def write_data(kind, path, examples, seq):
    if kind == "text":
        with open(path, "wb") as f:
            f.write(os.urandom(1 << 20))
    elif kind == "padded":
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "padded_text_data.py"), path,
                        "--examples", str(examples), "--seq", str(seq)], check=True,
                       stdout=subprocess.DEVNULL)
    else:
        cnn_bench.write_images(path, examples, channels=3 if kind == "rgb" else 1)


def export(factory, model, kind, data, out, seq):
    size = ["--seq", str(seq)] if kind == "text" else ["--data", data]
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "torch_export.py"),
                    f"{factory}:{model}", "--batch", "4", "--out", out] + size, check=True,
                   stdout=subprocess.DEVNULL)


def sluice_side(a, kind, exported, data, batch, metrics):
    """cnn_bench's plan and train commands at this batch (one thread); a text model adds --seq."""
    job = argparse.Namespace(sluice=a.sluice, batch=batch, sluice_flags=a.sluice_flags + (
        f" --seq {a.seq}" if kind == "text" else ""))
    plan = cnn_bench.sluice_plan(job, exported, data, 1)
    records, usage = cnn_bench.run_sluice(job, exported, data, 1, metrics, a.steps)
    summary = next(r for r in records if r.get("summary"))
    return {"plan_bytes": plan, "peak_tensor_bytes": summary["peak_allocated_bytes"],
            "peak_rss_bytes": usage.ru_maxrss * 1024}


def torch_side(a):
    """Runs in its own process (--torch-side), so that its RSS is its own."""
    import torch
    rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sys.path.insert(0, os.path.join(ROOT, "tests", "parity"))
    from gpt_reference import read_safetensors
    from torch_train import imported_module, peak_step_bytes, step
    model, opt = imported_module(a.factory_file, a.torch_side, a.init, 1)
    if MODELS[a.torch_side] == "text":
        gen = torch.Generator().manual_seed(0)
        inputs = [torch.randint(0, 256, (a.batch, a.seq), generator=gen) for _ in range(2)]
    else:  # each argument of forward binds the array of its name, as the exporter binds them
        arrays, _ = read_safetensors(a.data)
        names = list(inspect.signature(model.forward).parameters)
        inputs = [arrays[n][:a.batch] for n in names]
    for _ in range(a.steps - 1):
        step(model, opt, *inputs)
    print(json.dumps({"peak_tensor_bytes": peak_step_bytes(model, opt, *inputs),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "rss_after_import_bytes": rss_import}))


def torch_run(a, model, factory, exported, data, batch):
    out = subprocess.run(
        [sys.executable, __file__, "--torch-side", model, "--factory-file", factory, "--init",
         os.path.join(exported, "init.safetensors"), "--data-file", data, "--batches", str(batch),
         "--steps", str(a.steps), "--seq", str(a.seq)],
        check=True, capture_output=True, text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,4,16,64,128")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seq", type=int, default=SEQ,
                   help="the sequence length of the text models (token and padded)")
    p.add_argument("--sluice-flags", default="",
                   help="more flags for sluice train and plan, e.g. --no-in-place")
    p.add_argument("--torch-side", help=argparse.SUPPRESS)  # internal: the model
    p.add_argument("--factory-file", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--data-file", dest="data", help=argparse.SUPPRESS)
    a = p.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    if a.torch_side:
        a.batch = batches[0]
        torch_side(a)
        return 0
    for model in a.models.split(","):
        if model not in MODELS:
            p.error(f"--models: unknown model '{model}' (one of {', '.join(MODELS)})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="import_memory.") as tmp:
        factory = os.path.join(tmp, "bench_models.py")
        with open(factory, "w") as f:
            f.write(factories(a.seq))
        for model in a.models.split(","):
            kind = MODELS[model]
            data = os.path.join(tmp, kind + (".txt" if kind == "text" else ".safetensors"))
            if not os.path.exists(data):
                write_data(kind, data, max(256, 2 * max(batches)), a.seq)
            exported = os.path.join(tmp, model)
            export(factory, model, kind, data, exported, a.seq)
            for batch in batches:
                t0 = time.monotonic()
                s = sluice_side(a, kind, exported, data, batch,
                                os.path.join(tmp, f"{model}_{batch}.jsonl"))
                t = torch_run(a, model, factory, exported, data, batch)
                rows.append({"model": model, "batch": batch, "sluice": s, "pytorch": t,
                             "tensor_ratio": s["peak_tensor_bytes"] / t["peak_tensor_bytes"],
                             "rss_ratio": s["peak_rss_bytes"] / t["peak_rss_bytes"],
                             "seconds": time.monotonic() - t0})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print("| model | batch | sluice peak B (plan) | PyTorch peak B | ratio | sluice RSS MB | "
          "PyTorch RSS MB (after import) | RSS ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, t = r["sluice"], r["pytorch"]
        plan = "= plan" if s["plan_bytes"] == s["peak_tensor_bytes"] else f"plan {s['plan_bytes']:,}"
        print(f"| {r['model']} | {r['batch']} | {s['peak_tensor_bytes']:,} ({plan}) | "
              f"{t['peak_tensor_bytes']:,} | {r['tensor_ratio']:.3f} | "
              f"{s['peak_rss_bytes'] / 1e6:.0f} | {t['peak_rss_bytes'] / 1e6:.0f} "
              f"({t['rss_after_import_bytes'] / 1e6:.0f}) | {r['rss_ratio']:.2f} |")
    for r in rows:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
