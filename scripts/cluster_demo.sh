#!/usr/bin/env bash
# make demo's workload on a cluster: Debian's etcd and three mlaserve servers on loopback (a
# scratch directory removed at the end), mlaserve-loadgen driving them through the cluster
# client (one client per rank), the membership as mlaserve-ctl shows it, then one server
# drained into the other two under a second load run, and a clean shutdown.
#
#   scripts/cluster_demo.sh [--duration-s N] [any other mlaserve-loadgen flag]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d -t mlaserve-cluster-demo.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd_port=$(free_port) peer_port=$(free_port)
/usr/bin/etcd --name=demo --data-dir="$dir/etcd" --log-level=error \
  --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-cluster="demo=http://127.0.0.1:$peer_port" >"$dir/etcd.log" 2>&1 &
pids+=($!)
cluster=(--etcd_endpoints="127.0.0.1:$etcd_port" --cluster=demo)

# Three servers share this machine's CPUs instead of each sizing its pool to all of them.
per_server=$(( $(nproc) / 3 ))
[ "$per_server" -ge 1 ] || per_server=1
ports=()
for name in a b c; do
  port=$(free_port)
  ports+=("$port")
  build/bin/mlaserve-server --listen="127.0.0.1:$port" --metrics_listen=127.0.0.1:0 --layers=2 \
    --devices="$per_server" --host_threads=1 \
    "${cluster[@]}" --etcd_lease_ttl_s=5 >"$dir/$name.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 300); do
  members=$(build/bin/mlaserve-ctl "${cluster[@]}" --json members 2>/dev/null | grep -o '"instance_id"' | wc -l || true)
  [ "$members" = 3 ] && break
  sleep 0.2
done
if [ "$members" != 3 ]; then
  echo "cluster demo: the three servers did not register:" >&2
  tail -n 5 "$dir"/*.log >&2
  exit 1
fi
echo "== members"
build/bin/mlaserve-ctl "${cluster[@]}" members | sed 's/^/  /'
echo
echo "== make demo's workload through the cluster client"
build/bin/mlaserve-loadgen "${cluster[@]}" --client_per_rank --workers=2 --sequences=72 \
  --prefix-tokens=1024 --context-tokens=128 --duration-s=20 "$@"
echo
echo "== a drain under load: the busiest server's sequences move to the others"
build/bin/mlaserve-loadgen "${cluster[@]}" --client_per_rank --continuous --workers=2 \
  --sequences=24 --system-prompts=256 --context-tokens=64 --steps-dist=uniform:8,32 \
  --duration-s=8 --warmup-s=1 --quiet --json >"$dir/load.json" 2>"$dir/load.log" &
load=$!
sleep 4
busiest=$(build/bin/mlaserve-ctl "${cluster[@]}" --json members | /usr/bin/python3 -c '
import json, sys
members = json.load(sys.stdin)["members"]
print(max(members, key=lambda m: m["load"]["sequences"])["address"])')
build/bin/mlaserve-ctl "${cluster[@]}" --target="$busiest" drain 2>/dev/null | sed 's/^/  /'
wait "$load" || { echo "cluster demo: the load run failed:" >&2; tail -n 5 "$dir/load.log" >&2; exit 1; }
/usr/bin/python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["points"][0]
tokens, errors = p["tokens"], p["errors"]
print(f"  load during the drain: {tokens} tokens, {errors} failed calls")' "$dir/load.json"
echo
echo "== members after the drain"
build/bin/mlaserve-ctl "${cluster[@]}" members | sed 's/^/  /'
