#!/usr/bin/env bash
# GPU checks, as one prepared script for a short lease of a GPU machine. Offline: builds its own models.
#
#   benchmarks/gpu_check.sh [PART ...]      PART: env tests ckpt step step512 lora step1024 vllm (default: all)
#
#   env       GPU, driver, torch / transformers / peft / trl / vLLM versions
#   tests     pytest -m gpu (tests/test_gpu.py): the trainer's steps on the GPU in float32 and bf16, full and
#             LoRA; the fused log-prob path vs the full-logits path at Qwen2.5-VL-3B widths (1e-5, float32)
#   ckpt      training-pass peak GPU memory with and without gradient checkpointing, 3B stand-in, 4 layers
#   step      our step vs TRL's GRPOTrainer on the GPU, bf16, 3B stand-in, 256 image / 128 new tokens
#   step512   the same at 512 new tokens;  lora: 128 new tokens with LoRA r 16;  step1024: 1,024 image tokens
#   vllm      the vLLM rollout engine against the HF model (benchmarks/gpu_check.py), when vLLM is installed
#
# Every part runs under its own time limit (GPU_CHECK_PART_S, default 240 s) and a failing part does not
# stop the others; each part's output goes to $GPU_CHECK_OUT/<part>.log (default ./gpu-check-logs) and to
# stdout. Exit status: 0 when every part asked for passed, 1 otherwise, 2 when there is no CUDA device.
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUTDIR=${GPU_CHECK_OUT:-gpu-check-logs}
LIMIT=${GPU_CHECK_PART_S:-240}
mkdir -p "$OUTDIR"
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible to torch; nothing checked" >&2
  exit 2
fi
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(env tests ckpt step step512 lora step1024 vllm)
STEP=(benchmarks/step_vs_trl.py --shape qwen2_5_vl_3b --device cuda --dtype bfloat16 --steps 2 --rounds 1)  # one warm-up step, one timed
failed=()
run_part() {  # name, command...
  local name=$1; shift
  echo "=== $name: $* ($(date -u +%H:%M:%S))"
  local t0=$SECONDS
  timeout "$LIMIT" "$@" 2>&1 | tee "$OUTDIR/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name")
}
for part in "${parts[@]}"; do
  case $part in
    env) run_part env bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; \
      $PY -c \"import torch, transformers, peft, accelerate; print('torch', torch.__version__, '| cuda', torch.version.cuda, \
'| transformers', transformers.__version__, '| peft', peft.__version__, '| accelerate', accelerate.__version__); \
import importlib.util as u; print('trl', __import__('trl').__version__ if u.find_spec('trl') else 'not installed', \
'| vllm', __import__('vllm').__version__ if u.find_spec('vllm') else 'not installed')\"" ;;
    tests) run_part tests $PY -m pytest -q -o addopts="" -p no:cacheprovider -m gpu -rA tests/test_gpu.py ;;
    ckpt) run_part ckpt $PY benchmarks/checkpointing_memory.py --device cuda --layers 4 --rows 8 \
      --image-tokens 256 --new-tokens 512 ;;
    step) run_part step $PY "${STEP[@]}" --image-tokens 256 --new-tokens 128 ;;
    step512) run_part step512 $PY "${STEP[@]}" --image-tokens 256 --new-tokens 512 ;;
    lora) run_part lora $PY "${STEP[@]}" --image-tokens 256 --new-tokens 128 --lora ;;
    step1024) run_part step1024 $PY "${STEP[@]}" --image-tokens 1024 --new-tokens 128 ;;
    vllm)
      if $PY -c "import vllm" 2>/dev/null; then
        run_part vllm $PY benchmarks/gpu_check.py
      else
        echo "=== vllm: not installed here (pip install -e '.[vllm]'); the vLLM engine check did not run"
        failed+=("vllm(not installed)")
      fi ;;
    *) echo "gpu_check: unknown part '$part'" >&2; exit 2 ;;
  esac
done
echo "=== gpu_check: ${#failed[@]} part(s) failed${failed:+: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
