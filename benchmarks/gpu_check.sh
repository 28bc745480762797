#!/usr/bin/env bash
# GPU check of the vLLM rollout engine (see benchmarks/gpu_check.py for what it prints).
# Needs: a CUDA GPU and `pip install -e '.[vllm]'` (vLLM pins its own torch). Offline: builds a tiny model.
#   benchmarks/gpu_check.sh [--family qwen2_5_vl] [--lora]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible to torch; nothing checked" >&2
  exit 2
fi
if ! python -c "import vllm" 2>/dev/null; then
  echo "gpu_check: vLLM is not installed: pip install -e '.[vllm]'" >&2
  exit 2
fi
python -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
exec python benchmarks/gpu_check.py "$@"
