#!/usr/bin/env bash
# On a GPU machine, from the project's root: build with the CUDA device (make build-gpu), run
# the GPU suite (no test may skip: MLASERVE_REQUIRE_GPU=1), the kernel benchmark and the
# service beside the CPU. Logs go to $OUT (or ./gpu-check/). Extra arguments are stages to
# run: build tests bench service (the default), compare typhoon profile. make's variables
# pass through the environment: SKIP_DEPS=1, CMAKE_ARGS="..." (README, "On a GPU machine");
# PYTHON: the interpreter with grpcio, numpy and torch for the Python client's tests.
set -uo pipefail
out=${OUT:-gpu-check}
mkdir -p "$out"
stages=${*:-build tests bench service}
python=${PYTHON:-/usr/bin/python3}
export MLASERVE_REQUIRE_GPU=1
status=0
for stage in $stages; do
  case $stage in
    build)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
        | tee "$out/gpu.txt"
      start=$(date +%s)
      make build-gpu > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
      echo "build: $(( $(date +%s) - start )) s"
      ;;
    tests)
      # Each test in a process of its own (a fault test ends its process's CUDA context).
      (cd build-gpu && ctest -L gpu -j 4 --timeout 300 --output-on-failure > "$out/gpu-tests.log" 2>&1)
      rc=$?; status=$((status | rc))
      tail -4 "$out/gpu-tests.log"
      # The engine and the server end to end on the GPU, through the C++ client.
      MLASERVE_TEST_GPU=cuda:0 build-gpu/bin/integration_test --gtest_filter='*Gpu*' \
        > "$out/gpu-service-tests.log" 2>&1
      rc=$?; status=$((status | rc))
      grep -E "^\[  (PASSED|FAILED) " "$out/gpu-service-tests.log"
      # The Python client and its FlashMLA drop-in against a server on the GPU.
      PYTHONPATH=build-gpu/python "$python" tests/integration/python_smoke_test.py \
        --server build-gpu/bin/mlaserve-server --devices=cuda:0 \
        --example client/python/examples/decode_example.py > "$out/gpu-python.log" 2>&1
      rc=$?; status=$((status | rc))
      tail -3 "$out/gpu-python.log"
      ;;
    compare)
      # The bf16 latent kernel: the seesaw schedule (default on Hopper over whole key blocks)
      # beside the plain warpgroup-MMA kernel and mma.sync (MLASERVE_CUDA_ATTENTION).
      for kind in seesaw wgmma mma; do
        echo "attention kernel: $kind"
        MLASERVE_CUDA_ATTENTION=$kind build-gpu/bin/mlaserve-bench kernel --device=cuda:0 \
          --batch 96 --heads 128 --sq 1,2 --sk 1024,2048,3072,4096,6144,16384 --repeats 20 \
          2>&1 | tail -13 | tee "$out/compare-$kind.txt"
      done
      ;;
    service)
      bash scripts/gpu_service_bench.sh 15
      ;;
    typhoon)
      # make demo's batch shape (the device time a served batch should match), then the
      # TyphoonMLA paper's, absorb-only beside hybrid on the GPU.
      build-gpu/bin/mlaserve-bench typhoon --device=cuda:0 --shared 1024 --suffix 128 \
        --batch 72,144,176,216 --sq 1 --repeats 20 2>&1 | tee "$out/typhoon-demo.txt" | tail -5
      build-gpu/bin/mlaserve-bench typhoon --device=cuda:0 --shared 4096 --suffix 512 \
        --batch 16,64,128,256,512 --sq 1,2 --repeats 10 2>&1 | tee "$out/typhoon-paper.txt" | tail -11
      ;;
    profile)
      stalls=""
      for r in barrier long_scoreboard short_scoreboard wait mio_throttle math_pipe_throttle \
               lg_throttle not_selected selected dispatch_stall no_instruction branch_resolving \
               membar drain sleeping imc_miss tex_throttle; do
        stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
      done
      ncu --kernel-name regex:Attention --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section Occupancy --metrics "${stalls#,}" \
        build-gpu/bin/mlaserve-bench kernel --device=cuda:0 --batch 96 --heads 128 --sq 1 \
        --sk 4096 --repeats 1 > "$out/ncu-attention.txt" 2>&1
      grep -E "stalled|Duration|Throughput|Warp Cycles|Eligible|Occupancy" "$out/ncu-attention.txt" \
        | head -40
      ;;
    bench)
      for kernel in amla snap; do
        build-gpu/bin/mlaserve-bench kernel --device=cuda:0 --kernel "$kernel" --batch 96 \
          --heads 128 --sq 1,2 --sk 1024,2048,3072,4096,6144,16384 --repeats 20 \
          2>&1 | tee "$out/bench-kernel-$kernel.txt"
      done
      ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
exit $status
