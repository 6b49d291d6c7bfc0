#!/usr/bin/env bash
# Runs every libFuzzer harness of the asan build (tests/fuzz/) for SECONDS each, from its seed
# corpus (tests/fuzz/corpus/<harness>/, plus the device profiles and the example flag file),
# and fails on the first crash, leak or UBSan report. New inputs go to a scratch corpus that
# is removed afterwards; a crashing input is kept in build-asan/fuzz-crashes/ to reproduce
# (`build-asan/bin/<harness> build-asan/fuzz-crashes/<file>`).
#   scripts/fuzz.sh SECONDS [HARNESS...]
set -euo pipefail

seconds="${1:?usage: scripts/fuzz.sh SECONDS [HARNESS...]}"
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build-asan/bin"
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  harnesses=(decode_fuzzer decode_stream_fuzzer register_prefix_fuzzer append_kv_fuzzer admin_fuzzer
             safetensors_fuzzer device_profile_fuzzer flagfile_fuzzer tokens_file_fuzzer
             shm_call_fuzzer ucx_call_fuzzer)
fi

scratch="$(mktemp -d "${TMPDIR:-/tmp}/mlaserve-fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
crashes="$root/build-asan/fuzz-crashes"

# One harness: its report on stdout, and on a crash the log's tail on stderr, exit 1.
fuzz_one() {
  local h="$1"
  local seeds=("$root/tests/fuzz/corpus/$h")
  case "$h" in
    device_profile_fuzzer) seeds=("$root/kernels/npu/profiles") ;;
    flagfile_fuzzer) seeds=("$root/deploy") ;;
  esac
  mkdir -p "$scratch/$h"
  # -rss_limit_mb: the fixture engine reserves a 64 MiB KV pool; ASan's shadow adds more.
  if ! "$bin/$h" "$scratch/$h" "${seeds[@]}" -max_total_time="$seconds" -print_final_stats=1 \
      -rss_limit_mb=4096 -artifact_prefix="$scratch/$h-" >"$scratch/$h.log" 2>&1; then
    mkdir -p "$crashes"
    cp "$scratch/$h"-* "$crashes/" 2>/dev/null || true
    echo "fuzz: $h FAILED (inputs kept in $crashes):" >&2
    tail -40 "$scratch/$h.log" >&2
    return 1
  fi
  local runs cov
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$h.log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$scratch/$h.log" | tail -1)
  echo "fuzz: $h ok, $runs runs in ${seconds} s, $cov"
}

# libFuzzer runs one process on one core: as many harnesses at once as there are cores, so
# make test's fuzzing stage takes its time divided by the cores, not the sum.
jobs_at_once="$(nproc)"
for h in "${harnesses[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do wait -n || true; done
  (
    if fuzz_one "$h" >"$scratch/$h.report" 2>&1; then echo 0; else echo 1; fi >"$scratch/$h.status"
  ) &
done
wait
status=0
for h in "${harnesses[@]}"; do
  cat "$scratch/$h.report"
  [ "$(cat "$scratch/$h.status" 2>/dev/null)" = 0 ] || status=1
done
exit $status
