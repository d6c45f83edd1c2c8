#!/usr/bin/env bash
# Validate align on one GPU in one command (at most ~8 minutes on one H100), then write one JSON and a short table:
#   1. install: the venv (scripts/_venv.sh) with the gpu (triton), test and oracle extras
#   2. gpu_tests: every `gpu`-marked test (pytest -m gpu over the test files that say `pytest.mark.gpu`: collecting
#      the whole tree imports every test module, most of this step's time; tests/kernels/test_gpu_check_script.py's
#      slow test proves the two collections equal)
#   3. gates: the Triton kernels' equivalence gates on CUDA in fp32 and bf16 (python -m align.model.kernel_gates);
#      the records go to OUT/gates (ALIGN_GATE_DIR), which the benchmark's "triton" arm then checks
#   4. sft_step: a 1B-class Mistral SFT step, align with torch kernels / with Triton kernels / plain transformers, the
#      same torch AdamW (bench/gpu_sft_step.py: tokens/s, MFU, step-0 loss of each)
#   5. decode: the engine's decode tokens/s beside transformers generate (bench/gpu_decode.py)
#   6. report: OUT/gpu_check.json + OUT/gpu_check.txt (bench/gpu_check_report.py)
# Every step runs under its own time limit (on a GPU 150 + 120 + 140 + 70 s: at most 8 minutes after the install)
# and its exit code is recorded; the script exits 1 if any step failed, 3 when asked for a GPU run without CUDA.
# The install needs the package index (or a venv made beforehand: --no-install).
#
#   bash scripts/gpu_check.sh                       # on a CUDA machine; OUT = runs/gpu_check/<UTC time>
#   bash scripts/gpu_check.sh --dry-run             # the same steps on this CPU: tiny shapes, fp32, the gates under
#                                                   # TRITON_INTERPRET=1 (fp32/fp16), gpu tests collected not run
#   options: --out DIR, --no-install (use the existing venv: $ALIGN_VENV or .venv, no pip),
#            --list-gpu-tests (print the test files the gpu_tests step runs, then exit)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DRY=0
INSTALL=1
LIST=0
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --no-install) INSTALL=0 ;;
        --list-gpu-tests) LIST=1 ;;
        --out) OUT="$2"; shift ;;
        *) echo "gpu_check.sh: unknown argument $1 (--dry-run, --no-install, --out DIR, --list-gpu-tests)" >&2
           exit 2 ;;
    esac
    shift
done
# a gpu test is marked by writing pytest.mark.gpu (pytestmark, a decorator or a param's marks) in its file
mapfile -t GPU_TEST_FILES < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu\b' tests | sort)
if [ "${#GPU_TEST_FILES[@]}" -eq 0 ]; then
    echo "gpu_check: no test file under tests/ says pytest.mark.gpu" >&2
    exit 1
fi
if [ "$LIST" -eq 1 ]; then
    printf '%s\n' "${GPU_TEST_FILES[@]}"
    exit 0
fi
OUT="${OUT:-runs/gpu_check/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
: > "$OUT/steps.tsv"

step() {  # step NAME LIMIT_S LOG COMMAND...: run under a time limit, record exit code and seconds
    local name="$1" limit="$2" log="$3"
    shift 3
    local t0=$SECONDS rc=0
    echo "gpu_check: $name ..." >&2
    timeout "$limit" "$@" > "$log" 2> "$log.err" || rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
    [ "$rc" -eq 0 ] || { echo "gpu_check: $name failed (exit $rc): $log.err" >&2; tail -5 "$log.err" >&2; }
    return 0
}

if [ "$INSTALL" -eq 1 ]; then
    t0=$SECONDS
    source scripts/_venv.sh
    rc=0
    align_venv "gpu,test,oracle" > "$OUT/install.log" 2>&1 || rc=$?
    printf 'install\t%s\t%s\n' "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
    [ "$rc" -eq 0 ] || { echo "gpu_check: install failed: $OUT/install.log" >&2; exit 1; }
else
    VENV="${ALIGN_VENV:-$PWD/.venv}"
fi
PY="$VENV/bin/python"
export ALIGN_GATE_DIR="$OUT/gates"

if [ "$DRY" -eq 1 ]; then
    export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
    DEV=cpu
    step gpu_tests 300 "$OUT/gpu_tests.log" "$PY" -m pytest -m gpu --collect-only -q -p no:cacheprovider \
        "${GPU_TEST_FILES[@]}"
    step gates 300 "$OUT/gates.log" "$PY" -m align.model.kernel_gates --device cpu --json "$OUT/gates.json"
    # the least that still runs every arm on a batch of several rows: the interpreter runs one program per row
    SFT_ARGS=(--device cpu --shape tiny --dtype float32 --batch 2 --seq 8 --warmup 1 --steps 1)
    DEC_ARGS=(--device cpu --shape tiny --dtype float32 --prompts 2 --prompt-len 16 --new 8 --repeats 1)
    SFT_LIMIT=300 DEC_LIMIT=300  # a shared 2-core host: room for its load, not a budget
else
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_check: no CUDA device visible to torch (use --dry-run on a CPU)" >&2
        exit 3
    fi
    DEV=cuda
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
    step gpu_tests 150 "$OUT/gpu_tests.log" "$PY" -m pytest -m gpu -q -p no:cacheprovider -rs "${GPU_TEST_FILES[@]}"
    step gates 120 "$OUT/gates.log" "$PY" -m align.model.kernel_gates --device cuda --json "$OUT/gates.json"
    SFT_ARGS=(--device cuda --shape 1b --dtype bfloat16 --batch 4 --seq 2048 --warmup 2 --steps 5)
    DEC_ARGS=(--device cuda --shape 1b --dtype bfloat16 --prompts 16 --new 128 --repeats 2)
    SFT_LIMIT=140 DEC_LIMIT=70
fi
step sft_step "$SFT_LIMIT" "$OUT/sft_step.json" "$PY" bench/gpu_sft_step.py "${SFT_ARGS[@]}"
step decode "$DEC_LIMIT" "$OUT/decode.json" "$PY" bench/gpu_decode.py "${DEC_ARGS[@]}"
"$PY" bench/gpu_check_report.py "$OUT"
rc=$?
echo "gpu_check: $OUT/gpu_check.json ($DEV)" >&2
exit "$rc"
