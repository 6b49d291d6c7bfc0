#!/usr/bin/env bash
# A commit's CPU serving path against this tree's, side by side on one machine
# (docs/performance.md section 11): one sequence at light load in head and latent space,
# alternating, two rounds; then this tree alone: one device's host threads on a 72-query batch
# (bench/pool_sizing.py's threads stage) and the small-batch grid beside PyTorch
# (mlaserve-bench peers).
#   once, in a checkout:  scripts/host_ab.sh prepare COMMIT   (writes build-ab/base/, ignored)
#   then:                 scripts/host_ab.sh run [light threads peers]   (reports in $OUT)
# This tree is the one in build/ (make build); the base is built beside it with the same
# CMAKE_ARGS from the environment (a machine whose dependencies live in a prefix of their own:
# CMAKE_ARGS=-DCMAKE_PREFIX_PATH=DIR). PYTHON: the interpreter with torch for `peers`.
set -uo pipefail
case "${1:-}" in
  prepare)
    commit=${2:?usage: scripts/host_ab.sh prepare COMMIT}
    rm -rf build-ab/base && mkdir -p build-ab/base
    git archive "$commit" | tar -x -C build-ab/base
    git rev-parse --short "$commit" > build-ab/base/COMMIT
    exit 0 ;;
  run) shift ;;
  *) echo "usage: scripts/host_ab.sh prepare COMMIT | run [stages]" >&2; exit 2 ;;
esac
stages=${*:-light threads peers}
out=${OUT:-host-ab}
mkdir -p "$out"
jobs=$(nproc)
eval "extra=(${CMAKE_ARGS:-})"  # quoted as on a shell command line, as make passes them
[ -x build/bin/mlaserve-server ] || { echo "host_ab: build the tree first (make build)" >&2; exit 1; }
new=build/bin
python=${PYTHON:-/usr/bin/python3}
base=/tmp/mlaserve-base-build
if [[ " $stages " == *" light "* ]]; then
  cmake -S build-ab/base -B $base -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLASERVE_CUDA=OFF \
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
          echo "== $side ($( [ $side = base ] && cat build-ab/base/COMMIT || echo 'this tree')), round $round"
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
