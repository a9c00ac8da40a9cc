#!/usr/bin/env bash
# Installs what the tests need beyond running (idempotent): the runtime packages (deps.sh),
# Python with pip and cmake, the OpenAI Python client (the server's compatibility test,
# crates/octoflow/tests/serve.rs) and llama.cpp itself through llama-cpp-python 0.3.36, the
# version the golden files were made with (the LoRA/merge test crates/octoflow/tests/llama_cpp.rs
# and the tokenizer / chat-template differential test crates/octoflow-text/tests/llama_cpp.rs;
# built from source: ~8 minutes on 2 cores).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=deps.sh
source "$here/deps.sh"
apt_install libvulkan1 mesa-vulkan-drivers g++ cmake python3 python3-pip

# pip_install MODULE SPEC: installs SPEC for the user unless MODULE imports. Debian's python
# refuses --user installs without --break-system-packages (PEP 668); a pyenv or venv python
# takes the plain form.
pip_install() {
  python3 -c "import $1" >/dev/null 2>&1 && return 0
  echo "installing: $2 (pip)" >&2
  python3 -m pip install --quiet --no-warn-script-location --user "$2" >&2 ||
    python3 -m pip install --quiet --no-warn-script-location --user --break-system-packages "$2" >&2
}

pip_install openai openai
pip_install jsonschema jsonschema
# GGML_NATIVE=OFF: a build for the CPU's advertised features can take AMX, which a virtual
# machine may advertise and still refuse (SIGILL in llama.cpp's quantized products); the default
# feature set (AVX2, FMA, F16C) runs everywhere the tests run.
CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" pip_install llama_cpp llama-cpp-python==0.3.36
# gpt-oss's chat template as llama.cpp ships it, for the harmony tests (crates/octoflow/tests/harmony.rs):
# read once from llama-cpp-python's source distribution into the model cache's test-data folder.
python3 "$here/check/gpt_oss_template.py" >/dev/null
