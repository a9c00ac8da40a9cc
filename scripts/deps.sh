#!/usr/bin/env bash
# Installs what building and running OctoFlow needs, only where it is missing (idempotent): a
# Rust toolchain (must already be there: rustup), Mesa's lavapipe Vulkan driver and the Vulkan
# loader (the GPU path runs on lavapipe where there is no GPU), and a C++ compiler for glslang.
# What only the tests need (llama.cpp, the OpenAI client) is scripts/test-deps.sh's job.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# apt_install PKG...: installs the packages not installed yet.
apt_install() {
  local need=()
  for pkg in "$@"; do
    have_pkg "$pkg" || need+=("$pkg")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  echo "installing: ${need[*]}" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
}

# Sourced by test-deps.sh for apt_install; run directly, install the runtime packages.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  apt_install libvulkan1 mesa-vulkan-drivers g++
fi
