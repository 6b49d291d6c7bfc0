#!/usr/bin/env bash
# The emulated NPU (kernels/npu/: its executor, its launches) of another commit against this
# tree's, on the GPU machine's 16-core host (docs/performance.md section 11.2):
# bench/pool_sizing.py's threads stage on both builds, alternating, two rounds; then make
# demo's workload on each build's own pool (no flags) beside 16 x 1 by hand.
#   here, once:        scripts/gpu_executor_ab.sh prepare COMMIT   (writes .gpu/old/)
#   in a device run:   scripts/gpu_executor_ab.sh run              (carry .gpu; reports in $OUT)
set -uo pipefail
case "${1:-}" in
  prepare)
    commit=${2:?usage: scripts/gpu_executor_ab.sh prepare COMMIT}
    rm -rf .gpu/old && mkdir -p .gpu/old
    git archive "$commit" kernels/npu | tar -x -C .gpu/old
    exit 0 ;;
  run) ;;
  *) echo "usage: scripts/gpu_executor_ab.sh prepare COMMIT | run" >&2; exit 2 ;;
esac
out=${OUT:-executor-ab}
mkdir -p "$out"
bash .gpu/build.sh -DMLASERVE_CUDA=OFF > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
lib=/opt/deb/usr/lib/x86_64-linux-gnu
export PATH=/opt/deb/usr/bin:$PATH LD_LIBRARY_PATH=$lib LIBRARY_PATH=$lib
export PKG_CONFIG_PATH=$lib/pkgconfig:/opt/deb/usr/share/pkgconfig
old=/tmp/mlaserve-old
rm -rf $old && mkdir -p $old
tar --exclude='./build*' --exclude='./.gpu' --exclude='./.git' -cf - . | tar -xf - -C $old
rm -rf $old/kernels/npu && cp -r .gpu/old/kernels/npu $old/kernels/npu
cmake -S $old -B $old/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH=/opt/deb/usr -DMLASERVE_WERROR=OFF -DMLASERVE_CUDA=OFF \
  "-DCMAKE_CXX_FLAGS=-isystem /opt/deb/usr/include/x86_64-linux-gnu" > "$out/build-old.log" 2>&1
cmake --build $old/build -j "$(nproc)" --target mlaserve-server mlaserve-loadgen \
  >> "$out/build-old.log" 2>&1 || { tail -20 "$out/build-old.log"; exit 1; }
for round in 1 2; do
  for side in old new; do
    bin=build-gpu/bin
    [ $side = old ] && bin=$old/build/bin
    echo "== $side executor, round $round"
    python3 bench/pool_sizing.py --bin $bin --duration-s 6 --stages threads | tail -6
  done
done 2>&1 | tee "$out/ab_executor.txt"
for side in old new; do
  bin=build-gpu/bin
  [ $side = old ] && bin=$old/build/bin
  echo "== $side: make demo's workload"
  python3 bench/pool_sizing.py --bin $bin --duration-s 10 --rounds 1 --stages pool \
    --hand-pools "$(nproc)" | tail -3
done 2>&1 | tee -a "$out/ab_executor.txt"
rm -rf $old
