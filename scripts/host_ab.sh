#!/usr/bin/env bash
# A commit's CPU serving path against this tree's, side by side on one machine (the GPU
# machine's 16-core host or this one; docs/performance.md section 11): one sequence at light
# load in head and latent space, alternating, two rounds; then this tree alone: one device's
# host threads on a 72-query batch (bench/pool_sizing.py's threads stage) and the small-batch
# grid beside PyTorch (mlaserve-bench peers).
#   here, once:   scripts/host_ab.sh prepare COMMIT        (writes .gpu/base/, git-ignored)
#   then:         scripts/host_ab.sh run [light threads peers]   (reports in $OUT)
# On the GPU machine carry .gpu (its build.sh and packages); elsewhere the tree's build/ is
# used and the base is built beside it.
set -uo pipefail
case "${1:-}" in
  prepare)
    commit=${2:?usage: scripts/host_ab.sh prepare COMMIT}
    rm -rf .gpu/base && mkdir -p .gpu/base
    git archive "$commit" | tar -x -C .gpu/base
    git rev-parse --short "$commit" > .gpu/base/COMMIT
    exit 0 ;;
  run) shift ;;
  *) echo "usage: scripts/host_ab.sh prepare COMMIT | run [stages]" >&2; exit 2 ;;
esac
stages=${*:-light threads peers}
out=${OUT:-host-ab}
mkdir -p "$out"
jobs=$(nproc)
extra=()
if [ -f .gpu/build.sh ] && command -v nvidia-smi > /dev/null; then  # the lent GPU machine
  bash .gpu/build.sh -DMLASERVE_CUDA=OFF > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  new=build-gpu/bin
  lib=/opt/deb/usr/lib/x86_64-linux-gnu
  export PATH=/opt/deb/usr/bin:$PATH LD_LIBRARY_PATH=$lib LIBRARY_PATH=$lib
  export PKG_CONFIG_PATH=$lib/pkgconfig:/opt/deb/usr/share/pkgconfig
  extra=(-DCMAKE_PREFIX_PATH=/opt/deb/usr -DMLASERVE_WERROR=OFF
         "-DCMAKE_CXX_FLAGS=-isystem /opt/deb/usr/include/x86_64-linux-gnu")
  python=python3
else
  [ -x build/bin/mlaserve-server ] || { echo "host_ab: build the tree first (make build)" >&2; exit 1; }
  new=build/bin
  python=/usr/bin/python3
fi
base=/tmp/mlaserve-base-build
if [[ " $stages " == *" light "* ]]; then
  cmake -S .gpu/base -B $base -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLASERVE_CUDA=OFF \
    "${extra[@]}" > "$out/build-base.log" 2>&1 &&
  cmake --build $base -j "$jobs" --target mlaserve-server mlaserve-loadgen \
    >> "$out/build-base.log" 2>&1 || { tail -20 "$out/build-base.log"; exit 1; }
fi
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs" | tee "$out/host.txt"

light() {  # $1: bin folder; one server with no flags, one sequence, head then latent space
  local port=$((20000 + RANDOM % 20000))
  "$1/mlaserve-server" --listen=127.0.0.1:$port --metrics_listen= > "$out/server.log" 2>&1 &
  local pid=$!
  sleep 2
  for space in head latent; do
    printf '%s ' "$space"
    "$1/mlaserve-loadgen" --target=127.0.0.1:$port --workers=1 --sequences=1 \
      --prefix-tokens=1024 --context-tokens=128 --duration-s=8 --space=$space 2>&1 |
      grep -E "device host time|^  latency" | tr -s ' ' | tr '\n' ' '
    echo
  done
  kill $pid; wait $pid 2>/dev/null
}

for stage in $stages; do
  case $stage in
    light)
      for round in 1 2; do
        for side in base new; do
          bin=$new
          [ $side = base ] && bin=$base/bin
          echo "== $side ($( [ $side = base ] && cat .gpu/base/COMMIT || echo 'this tree')), round $round"
          light $bin
        done
      done 2>&1 | tee "$out/light.txt" ;;
    threads)
      $python bench/pool_sizing.py --bin $new --duration-s 6 --stages threads 2>&1 | tail -8 |
        tee "$out/threads.txt" ;;
    peers)
      $new/mlaserve-bench peers --peer_python=$python --grid_batch 1,4,16 --grid_heads 128 \
        --grid_sq 1 --grid_sk 1024,4096,16384 --threads "$jobs" 2>&1 | tail -12 | tee "$out/peers.txt" ;;
  esac
done
