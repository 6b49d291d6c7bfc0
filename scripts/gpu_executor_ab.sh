#!/usr/bin/env bash
# The emulated NPU (kernels/npu/: its executor, its launches) of another commit against this
# tree's, on a many-core host (docs/performance.md section 11.2): bench/pool_sizing.py's
# threads stage on both builds, alternating, two rounds; then make demo's workload on each
# build's own pool (no flags) beside one device per core by hand.
#   once, in a checkout:  scripts/gpu_executor_ab.sh prepare COMMIT  (writes build-ab/old/)
#   then:                 scripts/gpu_executor_ab.sh run             (reports in $OUT)
# Both sides build without CUDA, with CMAKE_ARGS from the environment (a machine whose
# dependencies live in a prefix of their own: CMAKE_ARGS=-DCMAKE_PREFIX_PATH=DIR); PYTHON: the
# interpreter for bench/pool_sizing.py.
set -uo pipefail
case "${1:-}" in
  prepare)
    commit=${2:?usage: scripts/gpu_executor_ab.sh prepare COMMIT}
    rm -rf build-ab/old && mkdir -p build-ab/old
    git archive "$commit" kernels/npu | tar -x -C build-ab/old
    exit 0 ;;
  run) ;;
  *) echo "usage: scripts/gpu_executor_ab.sh prepare COMMIT | run" >&2; exit 2 ;;
esac
out=${OUT:-executor-ab}
mkdir -p "$out"
eval "extra=(${CMAKE_ARGS:-})"  # quoted as on a shell command line, as make passes them
python=${PYTHON:-/usr/bin/python3}
new=build-ab/new
cmake -S . -B $new -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLASERVE_CUDA=OFF "${extra[@]}" \
  > "$out/build.log" 2>&1 &&
cmake --build $new -j "$(nproc)" --target mlaserve-server mlaserve-loadgen >> "$out/build.log" 2>&1 ||
  { tail -20 "$out/build.log"; exit 1; }
old=/tmp/mlaserve-old
rm -rf $old && mkdir -p $old
tar --exclude='./build*' --exclude='./.git' -cf - . | tar -xf - -C $old
rm -rf $old/kernels/npu && cp -r build-ab/old/kernels/npu $old/kernels/npu
cmake -S $old -B $old/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLASERVE_CUDA=OFF "${extra[@]}" \
  > "$out/build-old.log" 2>&1
cmake --build $old/build -j "$(nproc)" --target mlaserve-server mlaserve-loadgen \
  >> "$out/build-old.log" 2>&1 || { tail -20 "$out/build-old.log"; exit 1; }
for round in 1 2; do
  for side in old new; do
    bin=$new/bin
    [ $side = old ] && bin=$old/build/bin
    echo "== $side executor, round $round"
    "$python" bench/pool_sizing.py --bin $bin --duration-s 6 --stages threads | tail -6
  done
done 2>&1 | tee "$out/ab_executor.txt"
for side in old new; do
  bin=$new/bin
  [ $side = old ] && bin=$old/build/bin
  echo "== $side: make demo's workload"
  "$python" bench/pool_sizing.py --bin $bin --duration-s 10 --rounds 1 --stages pool \
    --hand-pools "$(nproc)" | tail -3
done 2>&1 | tee -a "$out/ab_executor.txt"
rm -rf $old
