#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu_check.sh built build-gpu/: make demo's workload through
# gRPC on --devices=cuda:0 beside the best CPU pool of the same machine, then one sequence at
# light load. Each run starts its own server; reports go to $OUT (or ./gpu-check/).
#   scripts/gpu_service_bench.sh [seconds per run, default 15]
set -uo pipefail
out=${OUT:-gpu-check}
mkdir -p "$out"
seconds=${1:-15}
bin=build-gpu/bin
cores=$(nproc)

# Starts a server with the given flags and waits until it serves: sets server_pid and port.
start_server() {
  local log=$1; shift
  $bin/mlaserve-server --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 --layers=2 "$@" \
    >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 120); do
    if grep -q "ready: serving" "$log"; then
      port=$(sed -n 's/.*gRPC on port \([0-9]*\).*/\1/p' "$log" | head -1)
      return 0
    fi
    kill -0 $server_pid 2>/dev/null || break
    sleep 0.5
  done
  cat "$log" >&2
  return 1
}
stop_server() { kill -TERM $server_pid 2>/dev/null; wait $server_pid 2>/dev/null; }

# The server's device kernel time so far: "seconds batches" (mlaserve_device_kernel_seconds).
kernel_totals() {
  curl -s "127.0.0.1:$metrics_port/metrics" | awk '
    /^mlaserve_device_kernel_seconds_sum/ {s=$2} /^mlaserve_device_kernel_seconds_count/ {c=$2}
    END {print s+0, c+0}'
}

load() {  # label port workers sequences prefix context
  local label=$1 port=$2 workers=$3 sequences=$4 prefix=$5 context=$6
  $bin/mlaserve-loadgen --target=127.0.0.1:$port --workers=$workers --sequences=$sequences \
    --prefix-tokens=$prefix --context-tokens=$context --duration-s=$seconds \
    >"$out/load.tmp" 2>&1
  echo "== $label ($workers ranks x $sequences sequences, prefix $prefix + $context)" \
    | tee -a "$out/service-bench.txt"
  cat "$out/load.tmp" >> "$out/service-bench.txt"
  grep -E "throughput|latency  |device host|RPC overhead|batches|plans" "$out/load.tmp"
  rm -f "$out/load.tmp"
  if [ -n "${metrics_port:-}" ]; then
    read -r seconds_now batches_now < <(kernel_totals)
    awk -v s0="$seconds_before" -v c0="$batches_before" -v s1="$seconds_now" -v c1="$batches_now" \
      'BEGIN { if (c1 > c0) printf "  device kernel time %.1f us a batch over %d batches\n", (s1 - s0) / (c1 - c0) * 1e6, c1 - c0 }' \
      | tee -a "$out/service-bench.txt"
    seconds_before=$seconds_now batches_before=$batches_now
  fi
}

stages=${STAGES:-gpu cpu}
log=$out/service-servers.log
if [[ " $stages " == *" gpu "* ]]; then
  start_server "$log.tmp" --devices=cuda:0 || exit 1
  grep -E "starting|device:" "$log.tmp"
  metrics_port=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$log.tmp" | head -1)
  read -r seconds_before batches_before < <(kernel_totals)
  for workers in ${GPU_WORKERS:-2 8 16}; do load "gpu-$workers" $port $workers 72 1024 128; done
  load gpu-light $port 1 1 1024 128
  curl -s "127.0.0.1:$metrics_port/metrics" |
    grep -E "^mlaserve_device_kernel_seconds_(sum|count)|^mlaserve_batch_(kv_)?bytes_to_device_(sum|count)|^mlaserve_device_memory_bytes" \
    | tee -a "$out/service-bench.txt"
  stop_server
  cat "$log.tmp" >> "$log"
  metrics_port=""
fi
if [[ " $stages " == *" cpu "* ]]; then
  start_server "$log.tmp" --devices=$cores --host_threads=1 || exit 1
  load "cpu-$cores" $port $cores 72 1024 128
  stop_server
  cat "$log.tmp" >> "$log"
fi
rm -f "$log.tmp"
