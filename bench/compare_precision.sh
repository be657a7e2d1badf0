#!/usr/bin/env bash
# Mixed precision side by side in one run (issue 35): sluice fp32, sluice --precision bf16, PyTorch
# 1.13 fp32 and PyTorch autocast bf16 (torch.autocast("cpu", dtype=torch.bfloat16)), back to back
# per configuration so that all four see the same machine load.
#   small   GPT vocab 256, L=4, H=4, C=128, T=64,  B=16
#   medium  GPT vocab 256, L=6, H=6, C=384, T=256, B=8
# AdamW, median step of STEPS timed steps (default 10) after 2 warm-up steps, at THREADS threads
# (default "1 2"). Peak: the bytes of every live tensor at a step's worst moment (train_bench's
# peak_tensor_bytes, torch_train.py's profiler figure). Extra flags for sluice in SLUICE_FLAGS
# (e.g. "--no-recompute": the issue's memory target is without recompute).
# Prints the CPU's model and its bf16-related flags first: every figure goes with them. Beside the
# tokens/s ratio (median wall time of a step), "cpu" is sluice's bf16 / fp32 speed by the least
# process CPU time of a step (train_bench's cpu_ms_min, every thread): on a loaded machine the
# wall time swings with the other processes, the least CPU time much less.
# Usage: bench/compare_precision.sh [BUILD_DIR] [MODEL...]   (default: build small medium)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(small medium)
steps=${STEPS:-10}
read -r -a threads_list <<<"${THREADS:-1 2}"
read -r -a extra <<<"${SLUICE_FLAGS:-}"

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile|avx512_vnni)$' | tr '\n' ' ')"
printf "%-7s %-3s %11s %11s %6s %6s %11s %11s %6s %6s %12s %12s %6s %12s %12s\n" model thr \
  "fp32 tok/s" "bf16 tok/s" ratio cpu "torch fp32" "torch bf16" "s/t" "s/t" \
  "fp32 peak" "bf16 peak" ratio "torch fp32" "torch bf16"
for model in "${models[@]}"; do
  case $model in
    small) shape=(--vocab 256 --layers 4 --heads 4 --dim 128 --seq 64 --batch 16) ;;
    medium) shape=(--vocab 256 --layers 6 --heads 6 --dim 384 --seq 256 --batch 8) ;;
    *) echo "compare_precision.sh: unknown model '$model' (small or medium)" >&2; exit 2 ;;
  esac
  for t in "${threads_list[@]}"; do
    # As `sluice train` runs by default: it restarts itself with OMP_WAIT_POLICY=passive when the
    # variable is unset (cli/main.cc), which train_bench does not.
    run() { OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} "$build/bench/train_bench" --threads "$t" --steps "$steps" --warmup 2 "${shape[@]}" "$@" ${extra[@]+"${extra[@]}"}; }
    torch() { /usr/bin/python3 bench/torch_train.py --threads "$t" --steps "$steps" --warmup 2 "${shape[@]}" "$@"; }
    f=$(run --precision fp32)
    b=$(run --precision bf16)
    p=$(torch)
    q=$(torch --autocast)
    python3 - "$model" "$t" "$f" "$b" "$p" "$q" <<'PY'
import json, sys
m, t = sys.argv[1], sys.argv[2]
f, b, p, q = (json.loads(x) for x in sys.argv[3:7])
tok = lambda r: r['tokens_per_s']
peak = lambda r: r['peak_tensor_bytes']
cpu = f['cpu_ms_min'] / b['cpu_ms_min']
print(f"{m:<7} {t:<3} {tok(f):11.0f} {tok(b):11.0f} {tok(b)/tok(f):6.2f} {cpu:6.2f} {tok(p):11.0f} {tok(q):11.0f} "
      f"{tok(f)/tok(p):6.2f} {tok(b)/tok(q):6.2f} {peak(f):12d} {peak(b):12d} {peak(b)/peak(f):6.2f} "
      f"{peak(p):12d} {peak(q):12d}")
PY
  done
done
echo "columns: ratio = sluice bf16 / fp32 tokens/s; cpu = the same by least CPU time a step;"
echo "         s/t = sluice fp32 / torch fp32, then sluice bf16 / torch autocast bf16"
