#!/usr/bin/env bash
# mlaserve's GPU kernels beside FlashMLA's dense decode and a PyTorch absorb, on a Hopper GPU,
# from the project's root (a benchmark only: FlashMLA is built here, never part of mlaserve).
#
#   bash scripts/flashmla_side_by_side.sh [stage ...]
#
# Stages (default: all but invariant, in this order):
#   table5   B=96, H=128, Sq 1 and 2, Sk 1K-16K: the AMLA paper's Table-5 shapes, with the
#            check that FlashMLA ran at its reference rate (below; exit 1 where not)
#   h64      the same at H=64 (Kimi K2, or DeepSeek-V3 over two GPUs), Sk 4K and 16K
#   memory   H=16 (8-way tensor parallel), B=128, Sk 4K-32K: memory-bound, GB/s of the cache
#   small    B=1-8 beside B=96 at Sk 16K and 64K (how well a few requests fill the GPU)
#   typhoon  TyphoonMLA's shapes (a 4,096-token prefix shared by B queries with 512 own):
#            mlaserve's hybrid and absorb-only beside the peers' absorb-only, DeepSeek-V3 and
#            Kimi K2
#   invariant  mlaserve's batch-invariant mode beside its default on the table5 shapes
#   build    only the builds
#
# Environment:
#   FLASHMLA_SRC  a FlashMLA source tree with its CUTLASS submodule (csrc/cutlass/include);
#                 without it the pinned commit is cloned from GitHub (needs the network)
#   PYTHON        the Python with CUDA PyTorch (default: python3)
#   OUT           where the tables go (default: ./flashmla-side-by-side)
#   SKIP_BUILD=1  use build-gpu/ as it is (otherwise `make build-gpu` first)
#   REPEATS, ROUNDS  calls a side per round (20) and alternations (3)
set -euo pipefail
flashmla_commit=9241ae3  # the FlashMLA the reference rates below were measured with
out=${OUT:-flashmla-side-by-side}
python=${PYTHON:-python3}
stages=${*:-table5 h64 memory small typhoon}
repeats=${REPEATS:-20}
rounds=${ROUNDS:-3}
bench=build-gpu/bin/mlaserve-bench
mkdir -p "$out"

if [ "${SKIP_BUILD:-0}" != 1 ]; then make build-gpu > "$out/build.log" 2>&1 || {
  tail -30 "$out/build.log"; exit 1; }; fi

# FlashMLA, built once into build-gpu/flashmla (Hopper only: its SM100 kernels need another
# GPU and a newer nvcc). CUDA 13 keeps CCCL's headers under include/cccl, which the host
# compiler of a PyTorch extension otherwise misses.
flashmla=build-gpu/flashmla
if ! ls "$flashmla"/flash_mla/cuda*.so > /dev/null 2>&1; then
  rm -rf "$flashmla"
  if [ -n "${FLASHMLA_SRC:-}" ]; then
    cp -r "$FLASHMLA_SRC" "$flashmla"
  else
    git clone --quiet https://github.com/deepseek-ai/FlashMLA.git "$flashmla"
    git -C "$flashmla" checkout --quiet "$flashmla_commit"
    git -C "$flashmla" submodule update --init --quiet csrc/cutlass
  fi
  cuda_home=${CUDA_HOME:-/usr/local/cuda}
  start=$(date +%s)
  (cd "$flashmla" && FLASH_MLA_DISABLE_SM100=1 MAX_JOBS=$(nproc) \
     CPLUS_INCLUDE_PATH="$cuda_home/include/cccl${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}" \
     "$python" setup.py build_ext --inplace) > "$out/flashmla-build.log" 2>&1 || {
    tail -30 "$out/flashmla-build.log"; exit 1; }
  echo "FlashMLA built in $(( $(date +%s) - start )) s"
fi
export PYTHONPATH="$PWD/$flashmla${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
  --format=csv | tee "$out/gpu.txt"
git log -1 --format='mlaserve %h %s' | tee -a "$out/gpu.txt"
if [ -e "$flashmla/.git" ]; then
  echo "FlashMLA $(git -C "$flashmla" rev-parse --short HEAD)" | tee -a "$out/gpu.txt"
else
  echo "FlashMLA from FLASHMLA_SRC (expected: $flashmla_commit)" | tee -a "$out/gpu.txt"
fi

peers() {  # stage name, then gpu-peers' flags
  local name=$1; shift
  "$bench" gpu-peers --device=cuda:0 --peer-python="$python" --repeats "$repeats" \
    --rounds "$rounds" "$@" 2>&1 | tee "$out/$name.txt"
}

# FlashMLA's TFLOP/s on the table5 shapes on an H200 (CUDA 13, the commit above, this script,
# docs/performance.md 20), Sq:Sk=rate. A run where FlashMLA falls more than 10 % below these,
# has no rate for one of them, or did not run at all is void: a mis-built or throttled peer
# would flatter mlaserve.
reference="1:1024=404 1:2048=523 1:3072=571 1:4096=607 1:6144=612 1:16384=664
           2:1024=554 2:2048=646 2:3072=678 2:4096=663 2:6144=689 2:16384=721"
check_reference() {
  awk -v ref="$reference" '
    BEGIN { for (i = 1; i <= split(ref, items, /[ \n]+/); i++) {
              if (split(items[i], kv, "=") == 2) { want[kv[1]] = kv[2]; wanted++ } } }
    /FlashMLA not found/ { print "VOID: FlashMLA did not run"; void = 1 }
    $1 ~ /^[0-9]+$/ && NF >= 10 && ($3 ":" $4) in want && !(($3 ":" $4) in seen) {
      key = $3 ":" $4; seen[key] = 1; found++
      if ($9 !~ /^[0-9.]+$/) { printf "FlashMLA Sq=%s Sk=%s: no rate (%s)\n", $3, $4, $9; void = 1; next }
      ratio = $9 / want[key]; printf "FlashMLA Sq=%s Sk=%s: %s TFLOP/s, %.2f of its reference\n",
        $3, $4, $9, ratio; if (ratio < 0.9) void = 1 }
    END { if (found < wanted) { printf "VOID: %d of the %d reference shapes ran\n", found, wanted; void = 1 }
          if (void) { print "VOID: FlashMLA is not at its reference rate here"; exit 1 } }
  ' "$out/table5.txt" | tee "$out/table5-check.txt"
}

status=0
for stage in $stages; do
  case $stage in
    table5)
      peers table5 --grid-batch 96 --grid-heads 128 --grid-sq 1,2 \
        --grid-sk 1024,2048,3072,4096,6144,16384 || status=1
      check_reference || status=1
      ;;
    h64)
      peers h64 --grid-batch 96 --grid-heads 64 --grid-sq 1,2 --grid-sk 4096,16384 || status=1 ;;
    memory)
      peers memory --grid-batch 128 --grid-heads 16 --grid-sq 1 \
        --grid-sk 4096,8192,16384,32768 || status=1 ;;
    small)
      peers small --grid-batch 1,2,4,8,96 --grid-heads 128 --grid-sq 1 \
        --grid-sk 16384,65536 || status=1 ;;
    typhoon)
      peers typhoon-deepseek-v3 --forms typhoon --model deepseek-v3 --shared 4096 --suffix 512 \
        --batch 16,32,64,128,512 || status=1
      peers typhoon-kimi-k2 --forms typhoon --model kimi-k2 --shared 4096 --suffix 512 \
        --batch 64,128,512 || status=1
      ;;
    build) ;;  # FlashMLA and mlaserve built, nothing run
    invariant)
      "$bench" kernel --device=cuda:0 --batch 96 --heads 128 --sq 1,2 \
        --sk 1024,2048,3072,4096,6144,16384 --repeats "$repeats" --batch-invariant 2>&1 \
        | tee "$out/invariant.txt" || status=1
      ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
exit $status
