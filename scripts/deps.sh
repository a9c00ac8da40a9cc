#!/usr/bin/env bash
# Installs what building and testing OctoFlow needs, only where it is missing (idempotent):
# a Rust toolchain (must already be there: rustup), Mesa's lavapipe Vulkan driver and the Vulkan
# loader (the GPU path runs on lavapipe where there is no GPU), and a C++ compiler for glslang.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for pkg in libvulkan1 mesa-vulkan-drivers g++ cmake python3; do
  have_pkg "$pkg" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# The OpenAI Python client (PyPI), for the server's compatibility test
# (crates/octoflow/tests/serve.rs runs crates/octoflow-serve/tests/openai_client.py).
if ! python3 -c "import openai" >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >&2
    $sudo apt-get install -y -qq --no-install-recommends python3-pip >&2
  fi
  echo "installing: openai (pip)" >&2
  # Debian's python refuses --user installs without --break-system-packages (PEP 668); a
  # pyenv or venv python takes the plain form.
  python3 -m pip install --quiet --no-warn-script-location --user openai >&2 ||
    python3 -m pip install --quiet --no-warn-script-location --user --break-system-packages openai >&2
fi

# llama.cpp itself (llama-cpp-python, PyPI; built from source: ~8 minutes on 2 cores), for the
# LoRA/merge compatibility test (crates/octoflow/tests/llama_cpp.rs) and the tokenizer / chat-template
# differential test (crates/octoflow-text/tests/llama_cpp.rs). The version the golden
# files were made with.
if ! python3 -c "import llama_cpp" >/dev/null 2>&1; then
  echo "installing: llama-cpp-python 0.3.36 (pip, builds llama.cpp from source)" >&2
  export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
  python3 -m pip install --quiet --no-warn-script-location --user llama-cpp-python==0.3.36 >&2 ||
    python3 -m pip install --quiet --no-warn-script-location --user --break-system-packages llama-cpp-python==0.3.36 >&2
fi
