#!/usr/bin/env bash
# One short GPU lease (about 10 minutes): calibrate full-size Llama-3.1-8B shapes in bf16 and a
# Gemma-3n-E2B shape (YOCO fast prefill on and off) on the CUDA device, validate both fitted profiles
# against a served trace, and leave every CSV, profile and report in one folder: $OUT (default
# ./lease_out). Run from anywhere:  OUT=/tmp/lease GPU=h200 bash calibration/gpu_lease.sh
#
#   --dry-run   the same steps on the CPU with tiny scaled models and a short trace (a minute or two),
#               so the script itself is tested where there is no GPU.
#   llama|gemma only that model's calibrate + validate (default: both). A lease runs one command for at
#               most 10 minutes, so run `... gpu_lease.sh llama` and `... gpu_lease.sh gemma` as two calls
#               into the same $OUT if both together would not fit.
#
# Files: environment.txt; <model>.calibrate.txt and <model>.validate.txt (the printed tables); and
# <model>/{profile.yaml, grid.csv, calibration.json, model_config.json, requests_measured.csv,
# requests_simulated.csv, steps_measured.csv, validation.csv, validation.html} (+ device.yaml on CPU).
# A failing step stops the script (set -e); what finished so far stays in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-lease_out}"
mkdir -p "$OUT"

DRY=""
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
ONLY="${1:-all}"
case "$ONLY" in all|llama|gemma) ;; *) echo "usage: gpu_lease.sh [--dry-run] [llama|gemma]" >&2; exit 2;; esac

if [[ -n "$DRY" ]]; then
    DEVICE=(--device cpu --threads 1 --quick)
    LLAMA_SCALE="layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256"
    GEMMA_SCALE="layers=6,kv_shared=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256,window=64"
    TRACE=(--requests 40 --prompt-median 48 --output-max 16 --max-num-batched-tokens 64 --num-blocks 256)
else
    DEVICE=(--device cuda --gpu "${GPU:-h200}")
    LLAMA_SCALE=""  # full size: 32 layers, hidden 4096, 16 GB of bf16 weights
    GEMMA_SCALE=""  # full text stack: 30 layers (20 KV-owning, 10 sharing), vocab 262400
    TRACE=(--requests 300 --prompt-median 512 --output-max 128 --max-num-batched-tokens 2048 --max-num-seqs 128
           --num-blocks 16384)
fi

servesim() { python -c 'from simulator.cli import app; app()' "$@"; }

{ date -u; git rev-parse HEAD 2>/dev/null || true; nvidia-smi 2>/dev/null || echo "no nvidia-smi";
  python -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'; } \
    >> "$OUT/environment.txt" 2>&1  # appended: the two phases of a split lease land in one folder

if [[ "$ONLY" != gemma ]]; then
    servesim calibrate "${DEVICE[@]}" --model llama-3.1-8b --scale "$LLAMA_SCALE" --out "$OUT/llama-3.1-8b" \
        | tee "$OUT/llama-3.1-8b.calibrate.txt"
    servesim validate "$OUT/llama-3.1-8b" "${TRACE[@]}" | tee "$OUT/llama-3.1-8b.validate.txt"
fi
if [[ "$ONLY" != llama ]]; then
    servesim calibrate "${DEVICE[@]}" --model gemma-3n-e2b --scale "$GEMMA_SCALE" --out "$OUT/gemma-3n-e2b" \
        | tee "$OUT/gemma-3n-e2b.calibrate.txt"
    servesim validate "$OUT/gemma-3n-e2b" "${TRACE[@]}" --fast-prefill | tee "$OUT/gemma-3n-e2b.validate.txt"
fi
echo "lease done ($ONLY): results in $OUT"
