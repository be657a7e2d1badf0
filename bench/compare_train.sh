#!/usr/bin/env bash
# Training throughput and peak tensor memory, sluice vs PyTorch 1.13, side by side in one run: each
# configuration runs sluice, then PyTorch, back to back, so that both see the same machine load.
#   small   GPT vocab 256,   L=4,  H=4,  C=128, T=64,  B=16   at 1 and 2 threads
#   medium  GPT vocab 256,   L=6,  H=6,  C=384, T=256, B=8    at 1 and 2 threads
#   gpt2    GPT vocab 50257, L=12, H=12, C=768, T=64,  B=4    at 2 threads
# AdamW, median step of STEPS timed steps (default 20; gpt2: STEPS_GPT2, default 6) after 2–3
# warm-up steps. Extra flags for sluice's side go in SLUICE_FLAGS, e.g. "--attention naive".
# PyTorch runs twice: as installed ("torch"), and with OPENBLAS_CORETYPE set to the GEMM kernels
# sluice uses ("torch@blas"): on a CPU that OpenBLAS does not know, PyTorch's GEMM otherwise runs
# OpenBLAS's SSE3 fallback while sluice switches to the kernels the CPU runs (kernels/blas.h), and
# the second ratio is the one that compares the frameworks rather than their BLAS settings.
# Usage: bench/compare_train.sh [BUILD_DIR] [MODEL...]   (default: build small medium gpt2)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(small medium gpt2)
steps=${STEPS:-20}
read -r -a extra <<<"${SLUICE_FLAGS:-}"

printf "%-7s %-7s %12s %12s %6s %12s %6s %14s %14s %6s %s\n" model threads "sluice tok/s" \
  "torch tok/s" ratio "torch@blas" ratio "sluice peak B" "torch peak B" ratio "simd blas attention"
for model in "${models[@]}"; do
  case $model in
    small) shape=(--vocab 256 --layers 4 --heads 4 --dim 128 --seq 64 --batch 16); threads=(1 2); n=$steps; w=3 ;;
    medium) shape=(--vocab 256 --layers 6 --heads 6 --dim 384 --seq 256 --batch 8); threads=(1 2); n=$steps; w=3 ;;
    gpt2) shape=(--vocab 50257 --layers 12 --heads 12 --dim 768 --seq 64 --batch 4); threads=(2); n=${STEPS_GPT2:-6}; w=2 ;;
    *) echo "compare_train.sh: unknown model '$model' (small, medium or gpt2)" >&2; exit 2 ;;
  esac
  for t in "${threads[@]}"; do
    s=$("$build/bench/train_bench" --threads "$t" --steps "$n" --warmup "$w" "${shape[@]}" ${extra[@]+"${extra[@]}"})
    p=$(/usr/bin/python3 bench/torch_train.py --threads "$t" --steps "$n" --warmup "$w" "${shape[@]}")
    blas=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["blas"])' "$s")
    q=$(OPENBLAS_CORETYPE=$blas /usr/bin/python3 bench/torch_train.py --threads "$t" --steps "$n" --warmup "$w" "${shape[@]}")
    python3 - "$model" "$t" "$s" "$p" "$q" <<'PY'
import json, sys
m, t = sys.argv[1], sys.argv[2]
s, p, q = (json.loads(x) for x in sys.argv[3:6])
st = s['tokens_per_s']
print(f"{m:<7} {t:<7} {st:12.0f} {p['tokens_per_s']:12.0f} {st/p['tokens_per_s']:6.2f} "
      f"{q['tokens_per_s']:12.0f} {st/q['tokens_per_s']:6.2f} "
      f"{s['peak_tensor_bytes']:14d} {p['peak_tensor_bytes']:14d} {s['peak_tensor_bytes']/p['peak_tensor_bytes']:6.2f} "
      f"{s['simd']} {s['blas']} (torch {p['blas']}, {q['blas']}) {s['attention']}")
PY
  done
done
