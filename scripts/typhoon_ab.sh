#!/usr/bin/env bash
# TyphoonMLA as served: a server with its hybrid (the default) against one with
# --typhoon=false (absorb-only), the same load on each, alternating, ROUNDS rounds. Extra
# arguments go to both servers (e.g. --devices=cuda:0). Reports in $OUT (or ./typhoon-ab/).
#   scripts/typhoon_ab.sh [server flags...]
#   WORKERS=8 SEQUENCES=72 PREFIX=4096 CONTEXT=512 SECONDS_PER_RUN=10 ROUNDS=2 BIN=build/bin
set -uo pipefail
out=${OUT:-typhoon-ab}
bin=${BIN:-build/bin}
mkdir -p "$out"
workers=${WORKERS:-8}
sequences=${SEQUENCES:-72}
prefix=${PREFIX:-4096}
context=${CONTEXT:-512}
seconds=${SECONDS_PER_RUN:-10}
rounds=${ROUNDS:-2}
[ -x "$bin/mlaserve-server" ] || { echo "typhoon_ab: no $bin/mlaserve-server (make build)" >&2; exit 1; }

run() {  # $1: --typhoon value; the rest: server flags
  local typhoon=$1; shift
  local log="$out/server-$typhoon.log"
  "$bin/mlaserve-server" --listen=127.0.0.1:0 --metrics-listen= --layers=2 --typhoon="$typhoon" \
    "$@" >"$log" 2>&1 &
  local pid=$! port=""
  for _ in $(seq 1 240); do
    grep -q "ready: serving" "$log" && break
    kill -0 $pid 2>/dev/null || { cat "$log" >&2; return 1; }
    sleep 0.5
  done
  if ! grep -q "ready: serving" "$log"; then
    echo "typhoon_ab: the server did not start serving in 120 s" >&2
    kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null
    return 1
  fi
  port=$(sed -n 's/.*gRPC on port \([0-9]*\).*/\1/p' "$log" | head -1)
  "$bin/mlaserve-loadgen" --target=127.0.0.1:$port --workers=$workers --sequences=$sequences \
    --prefix-tokens=$prefix --context-tokens=$context --duration-s=$seconds \
    >"$out/load-$typhoon.txt" 2>&1
  local rc=$?
  kill -TERM $pid 2>/dev/null
  wait $pid 2>/dev/null
  printf '%-9s ' "$typhoon"
  grep -E "throughput|batches|plans" "$out/load-$typhoon.txt" | tr -s ' ' | tr '\n' ' '
  echo
  return $rc
}

echo "TyphoonMLA served A/B: $workers ranks x $sequences sequences on a $prefix-token prefix + $context own, $seconds s a run; server flags: ${*:-(defaults)}"
status=0
for round in $(seq 1 "$rounds"); do
  for typhoon in true false; do run $typhoon "$@" || status=1; done
done
exit $status
