#!/usr/bin/env bash
# Installs the Debian 12 packages mlaserve builds and runs with. Idempotent: when every
# package is already present it touches nothing (no apt-get update, no network).
#   scripts/install_deps.sh          what `make`, `make test`, `make demo` and the benchmarks
#                                    need (PyTorch included: the FlashMLA drop-in's tests run
#                                    on torch tensors, and `mlaserve-bench peers` compares with it)
#   scripts/install_deps.sh --bench  the same (kept for `make bench-deps`)
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev openssl
  libabsl-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-pthread-dev libdnnl-dev libsleef-dev prometheus-cpp-dev libcpp-httplib-dev libucx-dev libsystemd-dev nlohmann-json3-dev
  python3 python3-dev python3-grpcio python3-protobuf python3-numpy python3-h2 python3-matplotlib python3-torch pybind11-dev
  python3-venv python3-pip python3-setuptools python3-wheel
  systemd strace clang-format prometheus
  etcd-server golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev
  clang-14 libclang-rt-14-dev libomp-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
