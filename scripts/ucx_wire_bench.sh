#!/usr/bin/env bash
# The UCX data plane between two network namespaces joined by a veth pair, over UCX's TCP
# transport, against a raw TCP socket pair moving the same bytes there and back between the
# same two ends (issue 37's goal: make demo's 72-query call <= 1.5x the wire), both in one
# run, alternating round by round (`mlaserve-bench wire`). Needs root (ip netns) and a build.
#   scripts/ucx_wire_bench.sh [mlaserve-bench flags, e.g. --rounds=5 --duration-s=20]
# Everything it makes (namespaces, the veth pair, processes) goes at its end.
set -euo pipefail
build="${BUILD_DIR:-$(dirname "$0")/../build}"
[ "$(id -u)" -eq 0 ] || { echo "ucx_wire_bench: needs root to create network namespaces" >&2; exit 1; }
tag=$$
server_ns="mlaserve-wire-s$tag" client_ns="mlaserve-wire-c$tag"
server_dev="mlws$((tag % 100000))" client_dev="mlwc$((tag % 100000))"
net="10.253.$((tag % 250 + 1))"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$server_ns" 2>/dev/null || true
  ip netns del "$client_ns" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$server_ns"
ip netns add "$client_ns"
ip link add "$server_dev" type veth peer name "$client_dev"
ip link set "$server_dev" netns "$server_ns"
ip link set "$client_dev" netns "$client_ns"
ip -n "$server_ns" addr add "$net.1/30" dev "$server_dev"
ip -n "$client_ns" addr add "$net.2/30" dev "$client_dev"
for ns in "$server_ns" "$client_ns"; do ip -n "$ns" link set lo up; done
ip -n "$server_ns" link set "$server_dev" up
ip -n "$client_ns" link set "$client_dev" up
# make demo's workload (head space); the far end sizes its answers from the same flags.
workload=(--sequences=72 --prefix-tokens=1024 --context-tokens=128 --layers=2)
ip netns exec "$server_ns" env UCX_TLS=tcp UCX_NET_DEVICES="$server_dev" \
  "$build/bin/mlaserve-server" --listen="$net.1:50051" --data_plane_ucx="$net.1:50052" \
  --data_plane_socket=none --layers=2 --log_level=warn &
pids+=($!)
ip netns exec "$server_ns" "$build/bin/mlaserve-bench" wire --wire_listen="$net.1:50060" \
  "${workload[@]}" &
pids+=($!)
ip netns exec "$client_ns" env UCX_TLS=tcp UCX_NET_DEVICES="$client_dev" \
  "$build/bin/mlaserve-bench" wire --target="$net.1:50051" --wire_echo="$net.1:50060" \
  --workers=1 --duration-s=10 --rounds=3 "${workload[@]}" "$@"
