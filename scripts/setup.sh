#!/usr/bin/env bash
# Installs dtsim's build and test dependencies from Debian 12 (bookworm) packages.
# Idempotent: installs only what is missing, and runs `apt-get update` only then.
# Run as root (or with sudo available) on a fresh machine; as any user once installed.
set -euo pipefail

packages=(
  build-essential     # g++ 12 (C++20), make
  cmake               # >= 3.25
  pkg-config          # finds SimGrid, which ships no CMake config
  libsimgrid-dev      # 3.32: discrete-event engine and flow-level network model
  libboost-graph-dev  # cluster topologies
  libyaml-cpp-dev     # experiment files
  nlohmann-json3-dev  # JSON output, Hugging Face config.json
  libcli11-dev        # command line
  libfmt-dev          # formatting
  libgtest-dev        # unit tests
  libgmock-dev        # unit tests (matchers)
  libbenchmark-dev    # micro-benchmarks
  libjemalloc-dev     # allocator of dtsim and the benchmarks (unfolded SimGrid runs at scale)
)

installed() {
  dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed$'
}

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#packages[@]} dependencies are installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "setup: missing packages (${missing[*]}) and not root; rerun as root" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"

for p in "${missing[@]}"; do
  installed "$p" || { echo "setup: $p failed to install" >&2; exit 1; }
done
echo "setup: done"
