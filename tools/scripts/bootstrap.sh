#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the demo need.
# Idempotent: quiet and offline when everything is present; runs
# `apt-get update` only when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libyaml-cpp-dev libgloo-dev
  libgtest-dev libgmock-dev
  prometheus-cpp-dev prometheus
  # The extension is built for Debian's python3; torch, numpy and pytest come
  # from PyPI into the venv of tools/scripts/python_env.sh (build/venv).
  python3 python3-dev python3-venv python3-pip pybind11-dev python3-pybind11
  iproute2 docker-compose python3-yaml  # the compose check and the netns cluster tests
  docker.io debootstrap binutils  # the compose cluster on a real engine (images built locally)
  dpkg-dev  # dpkg-shlibdeps: the Debian package's dependencies (tools/scripts/build_deb.sh)
  # The sanitizer and fuzz builds (tools/scripts/run_hardening.sh): clang with
  # its sanitizer and libFuzzer runtimes, lld, llvm-symbolizer for the stacks.
  clang lld libclang-rt-14-dev llvm
  # The small-message baseline (mpi-bench, tools/bench/latency_compare.py).
  openmpi-bin libopenmpi-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "bootstrap: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "bootstrap: done"
