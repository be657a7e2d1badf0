#!/usr/bin/env bash
# Training throughput and peak tensor memory, sluice vs PyTorch 1.13, side by side in one run:
# GPT vocab 256, 4 layers, 4 heads, C=128, T=64, batch 16, AdamW, at 1 and 2 threads.
# Usage: bench/compare_train.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
printf "%-8s %-10s %14s %14s %10s %16s %16s %10s\n" threads side "sluice tok/s" "torch tok/s" ratio "sluice peak B" "torch peak B" ratio
for t in 1 2; do
  s=$("$build/bench/train_bench" --threads "$t")
  p=$(/usr/bin/python3 bench/torch_train.py --threads "$t")
  python3 - "$t" "$s" "$p" <<'PY'
import json, sys
t, s, p = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(f"{t:<8} {'':<10} {s['tokens_per_s']:14.0f} {p['tokens_per_s']:14.0f} {s['tokens_per_s']/p['tokens_per_s']:10.2f} "
      f"{s['peak_tensor_bytes']:16d} {p['peak_tensor_bytes']:16d} {s['peak_tensor_bytes']/p['peak_tensor_bytes']:10.2f}")
PY
done
