#!/usr/bin/env bash
# The learning-curve check of mixed precision (issue 35): the small GPT (vocab 256, L=4, H=4,
# C=128, T=64, B=16, AdamW, the default cosine schedule) trained STEPS steps (default 300) on a
# text file under --precision fp32 and --precision bf16, same seed and data; held-out loss every
# EVERY steps (default 50) on EVAL_BATCHES batches (default 16). Prints both curves and the final
# held-out losses' relative difference, the issue's target being within 2%. Not a test: it needs
# the text, which the repository does not ship (tinyshakespeare, ~1.1 MB).
# Usage: bench/learning_curve_bf16.sh [BUILD_DIR] [TEXT]
#   (default: build ../shared/data/tinyshakespeare.txt); extra train flags in SLUICE_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
text=${2:-../shared/data/tinyshakespeare.txt}
steps=${STEPS:-300}
every=${EVERY:-50}
eval_batches=${EVAL_BATCHES:-16}
read -r -a extra <<<"${SLUICE_FLAGS:-}"
if [ ! -r "$text" ]; then
  echo "learning_curve_bf16.sh: cannot read the text '$text' (give its path as the second argument)" >&2
  exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load: $(cut -d' ' -f1-3 /proc/loadavg)"
for p in fp32 bf16; do
  "$build/sluice" train --data "$text" --vocab 256 --layers 4 --heads 4 --dim 128 --seq 64 \
    --batch 16 --steps "$steps" --eval-every "$every" --eval-batches "$eval_batches" \
    --precision "$p" --metrics "$out/$p.jsonl" --quiet ${extra[@]+"${extra[@]}"} >/dev/null
done
python3 - "$out/fp32.jsonl" "$out/bf16.jsonl" <<'PY'
import json, sys
def curve(path):
    lines = [json.loads(l) for l in open(path)]
    evals = {l["step"]: l["val_loss"] for l in lines if "val_loss" in l and "step" in l}
    summary = next(l for l in lines if l.get("summary"))
    return evals, summary
(f, fs), (b, bs) = curve(sys.argv[1]), curve(sys.argv[2])
print(f"{'step':>5} {'fp32 val':>9} {'bf16 val':>9} {'bf16/fp32':>9}")
for s in sorted(set(f) & set(b)):
    print(f"{s:>5} {f[s]:9.4f} {b[s]:9.4f} {b[s] / f[s]:9.4f}")
fv, bv = fs["val_loss"], bs["val_loss"]
print(f"final held-out loss: fp32 {fv:.4f}, bf16 {bv:.4f}, relative difference {abs(bv - fv) / fv:.4%} "
      f"(target within 2%); train loss fp32 {fs['final_loss']:.4f}, bf16 {bs['final_loss']:.4f}; "
      f"tokens/s fp32 {fs['tokens_per_s']:.0f}, bf16 {bs['tokens_per_s']:.0f}")
PY
