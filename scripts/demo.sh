#!/usr/bin/env bash
# The main job: mlaserve-server on its default emulated device pool (an Ascend-910 die for each
# CPU it may use, --devices=auto),
# driven by mlaserve-loadgen the way a serving framework drives it, then a short sweep of
# continuous traffic (its JSON, CSV and plots written to build/demo/), then a clean shutdown.
# Prints the server's start-up and shutdown lines, the load test's report and the sweep's rows.
#
#   scripts/demo.sh [--kv-dtype=bf16|fp8] [--duration-s N] [any other mlaserve-loadgen flag]
#
# --kv-dtype goes to the server (the format its sequences and prefix are held in: fp8 is
# SnapMLA's per-token FP8 cache); every other flag to the load generator.
set -euo pipefail
cd "$(dirname "$0")/.."

server_flags=()
loadgen_flags=()
for arg in "$@"; do
  case "$arg" in
    --kv-dtype=*|--kv_dtype=*) server_flags+=("--kv_dtype=${arg#*=}") ;;
    *) loadgen_flags+=("$arg") ;;
  esac
done

log=$(mktemp -t mlaserve-demo.XXXXXX.log)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then kill -TERM "$server_pid" 2>/dev/null || true; fi
  rm -f "$log"
}
trap cleanup EXIT

# DeepSeek-V3 shapes (128 heads), two layers, on the default pool; port 0 picks a free port.
build/bin/mlaserve-server --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 --layers=2 \
  "${server_flags[@]}" >"$log" 2>&1 &
server_pid=$!

port=""
for _ in $(seq 1 300); do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "demo: the server exited during start-up:" >&2
    cat "$log" >&2
    exit 1
  fi
  if grep -q "ready:" "$log"; then
    port=$(sed -n 's/.*gRPC on port \([0-9]*\).*/\1/p' "$log" | head -n1)
    break
  fi
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "demo: the server did not become ready in 30 s:" >&2
  cat "$log" >&2
  exit 1
fi
echo "== server"
sed 's/^/  /' "$log"

# Framework ranks, as many as the server's pool serves (--workers=auto: one per device), each
# decoding 72 sequences that share a 1024-token system prompt: 72 >= B_theta = 65, so the
# shared prefix runs TyphoonMLA's hybrid.
echo
echo "== load test"
build/bin/mlaserve-loadgen --target="127.0.0.1:$port" --sequences=72 \
  --prefix-tokens=1024 --context-tokens=128 --duration-s=20 "${loadgen_flags[@]}"

# The same server under traffic that arrives and retires (a closed population per rank, own
# prompts and output lengths drawn per sequence), swept over how many sequences a rank holds;
# the JSON, CSV and plots land in build/demo/ (docs/loadgen.md, "Sweeps").
echo
echo "== sweep"
mkdir -p build/demo
build/bin/mlaserve-loadgen --target="127.0.0.1:$port" --sweep=sequences:16,40,72 \
  --system-prompts=1024 --context-dist=lognormal:128,0.5 --steps-dist=uniform:4,16 \
  --duration-s=8 --warmup-s=3 --quiet --out=build/demo/sweep
/usr/bin/python3 client/loadgen/plot_sweep.py build/demo/sweep.json | sed 's/^/  wrote      /'

echo
echo "== shutdown"
kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=""
grep -E "draining|stopped|exit" "$log" | sed 's/^/  /' || true
if [ "$status" -ne 0 ]; then
  echo "demo: the server exited with status $status" >&2
  exit "$status"
fi
echo "  server exited cleanly"
