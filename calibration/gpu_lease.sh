#!/usr/bin/env bash
# One short GPU lease: calibrate full-size Llama-3.1-8B shapes in bf16 and a Gemma-3n-E2B shape (YOCO fast
# prefill on and off) on the CUDA device, validate both fitted profiles against a served trace, and leave
# every CSV, profile and report in one folder, $OUT (default ./lease_out). Run from anywhere:
#   OUT=/tmp/lease GPU=h200 bash calibration/gpu_lease.sh
#
#   --dry-run   the same steps on the CPU with tiny scaled models and a short trace (a minute or two),
#               so the script itself is tested where there is no GPU.
#   --pack      write the results to a scratch folder and leave one archive, $OUT/lease-<phase>.tar.gz, also
#               when a step fails: a lent machine sends back at most 8 files from $OUT, and empties $OUT
#               before each command, so each call's results must come back whole in one file.
#   llama|gemma only that model's calibrate + validate (default: both).
#
# On a lent GPU machine (Python 3.12, torch, no package registry) first run, here,
# `bash calibration/lease_wheels.sh`, and carry `.whl`: the packages the image lacks are installed from
# those wheels when $PYTHON (default python3) cannot import them; servesim itself runs from the checkout, not
# installed (servesim/__init__.py maps its folders). The GPU is read from the device's name (H100 SXM or PCIe,
# H200; GPU=... overrides). The lease calls, with 15 minutes of device time in mind (each phase takes a few
# minutes on an H200, ~1 more the first time for numba's compile; a command runs at most 10), one per model:
#   run(command="bash calibration/gpu_lease.sh --pack llama", carry=[".whl"], timeout_s=480)
#   run(command="bash calibration/gpu_lease.sh --pack gemma", carry=[".whl"], timeout_s=480)
# Each step's start time goes to environment.txt (`step ...` lines).
#
# Files: environment.txt; gpu_tests.txt (the executor's CUDA tests); <model>.calibrate.txt and
# <model>.validate.txt (the printed tables); and <model>/{profile.yaml, grid.csv, calibration.json,
# model_config.json, requests_measured.csv, requests_simulated.csv, steps_measured.csv, validation.csv,
# validation.html} (+ device.yaml on CPU).
# A failing step stops the script (set -e); what finished so far stays (and, with --pack, is archived).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-lease_out}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"

DRY="" PACK="" ONLY=all
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1;;
        --pack) PACK=1;;
        all|llama|gemma) ONLY="$arg";;
        *) echo "usage: gpu_lease.sh [--dry-run] [--pack] [llama|gemma]" >&2; exit 2;;
    esac
done

RESULTS="$OUT"
checkpoint() { :; }
if [[ -n "$PACK" ]]; then
    RESULTS="$(mktemp -d)"
    ARCHIVE="$(cd "$OUT" && pwd)/lease-$ONLY.tar.gz"
    # after every step, not only at exit: a command killed at its time limit runs no exit trap
    checkpoint() { tar czf "$ARCHIVE.part" -C "$RESULTS" . && mv -f "$ARCHIVE.part" "$ARCHIVE"; }
    trap 'checkpoint && echo "archived: $ARCHIVE"' EXIT
fi

# A lent machine's image lacks some dependencies: install the carried wheels (calibration/lease_wheels.sh).
NEEDED="import simpy, pydantic, plotly, typer, pandas, yaml, scipy, numba, torch"
if ! "$PY" -c "$NEEDED" 2>/dev/null && compgen -G ".whl/*.whl" > /dev/null; then
    SITE="$(mktemp -d)"
    "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c "$NEEDED"; then
    echo "missing Python packages for $PY: on a lent GPU machine, run calibration/lease_wheels.sh here" \
         "and carry .whl" >&2
    exit 3
fi

if [[ -n "$DRY" ]]; then
    DEVICE=(--device cpu --threads 1 --quick)
    LLAMA_SCALE="layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256"
    GEMMA_SCALE="layers=6,kv_shared=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256,window=64"
    TRACE=(--requests 40 --prompt-median 48 --output-max 16 --max-num-batched-tokens 64 --num-blocks 256)
else
    if [[ -z "${GPU:-}" ]]; then  # the catalog's name for the device torch sees
        NAME="$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))' 2>/dev/null || true)"
        case "$NAME" in
            *H200*) GPU=h200;;
            *H100*PCIe*) GPU=h100-pcie;;
            *H100*) GPU=h100-sxm;;
            *) echo "unknown GPU '$NAME': set GPU to its catalog name (hardware/catalog/gpus.yaml)" >&2; exit 4;;
        esac
    fi
    DEVICE=(--device cuda --gpu "$GPU")
    LLAMA_SCALE=""  # full size: 32 layers, hidden 4096, 16 GB of bf16 weights
    GEMMA_SCALE=""  # full text stack: 30 layers (20 KV-owning, 10 sharing), vocab 262400
    TRACE=(--requests 300 --prompt-median 512 --output-max 128 --max-num-batched-tokens 2048 --max-num-seqs 128
           --num-blocks 16384)
fi

servesim() {
    echo "step $(date -u +%T) $*" >> "$RESULTS/environment.txt"
    "$PY" -c 'from servesim.simulator.cli.main import main; main()' "$@"
}

{ date -u; git rev-parse HEAD 2>/dev/null || true; nvidia-smi 2>/dev/null || echo "no nvidia-smi";
  "$PY" -c 'import sys, torch, numpy, numba, pandas, pydantic, scipy, servesim
print("python", sys.version.split()[0], "numpy", numpy.__version__, "numba", numba.__version__, "pandas",
      pandas.__version__, "pydantic", pydantic.VERSION, "scipy", scipy.__version__, "torch", torch.__version__,
      "cuda", torch.cuda.is_available(), "servesim", servesim.__version__)'; } \
    >> "$RESULTS/environment.txt" 2>&1  # appended: the two phases of a split lease land in one folder

# The executor's CUDA forwards against the reference (skipped without a GPU); a failure is recorded, and the
# timings still follow: they measure the same kernels either way. No addopts: a lent machine lacks pytest-xdist.
echo "step $(date -u +%T) gpu tests" >> "$RESULTS/environment.txt"
"$PY" -m pytest -q -rfEs -p no:cacheprovider -o addopts= tests/calibration/test_gpu.py 2>&1 | tee "$RESULTS/gpu_tests.txt" || true
checkpoint

if [[ "$ONLY" != gemma ]]; then
    servesim calibrate "${DEVICE[@]}" --model llama-3.1-8b --scale "$LLAMA_SCALE" --out "$RESULTS/llama-3.1-8b" \
        | tee "$RESULTS/llama-3.1-8b.calibrate.txt"
    checkpoint
    servesim validate "$RESULTS/llama-3.1-8b" "${TRACE[@]}" | tee "$RESULTS/llama-3.1-8b.validate.txt"
    checkpoint
fi
if [[ "$ONLY" != llama ]]; then
    servesim calibrate "${DEVICE[@]}" --model gemma-3n-e2b --scale "$GEMMA_SCALE" --out "$RESULTS/gemma-3n-e2b" \
        | tee "$RESULTS/gemma-3n-e2b.calibrate.txt"
    checkpoint
    servesim validate "$RESULTS/gemma-3n-e2b" "${TRACE[@]}" --fast-prefill | tee "$RESULTS/gemma-3n-e2b.validate.txt"
fi
echo "lease done ($ONLY): results in $RESULTS"
