#!/bin/sh
# Every binary answers --help with its own flags and --version with the version and its matrix
# path, both on stdout with exit status 0 (scripts and packagers call them that way), and
# refuses a flag it does not know, or a value its flag cannot take, with the exit status its
# docs give (2 for the tools, 1 for the server, which systemd reads as a failed start).
#   help_version_test.sh BIN_DIR VERSION [bench]
# The server, the load generator and mlaserve-ctl are always built; with `bench` (a build with
# MLASERVE_BENCH on) mlaserve-bench and mlaserve-microbench are checked too, and missing
# ones fail like the others.
set -u
bin_dir="$1"
version="$2"
bench="${3:-}"
failures=0
fail() {
  echo "FAIL: $*"; failures=$((failures + 1))
}
check() {  # binary, a line its --help must hold (a grep pattern), the exit status of a bad flag
  if [ ! -x "$bin_dir/$1" ]; then
    fail "$1 is not in $bin_dir"
    return
  fi
  if ! help=$("$bin_dir/$1" --help 2>/dev/null); then
    fail "$1 --help exits $?"
  elif ! printf '%s\n' "$help" | grep -q -- "$2"; then
    fail "$1 --help has no line matching '$2'"
  elif printf '%s\n' "$help" | grep -q -- "--fromenv"; then
    fail "$1 --help lists abseil's own flags"
  fi
  if ! out=$("$bin_dir/$1" --version 2>/dev/null); then
    fail "$1 --version exits $?"
  elif [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] ||
       ! printf '%s\n' "$out" | grep -q "^$1 $version (matrix unit: .*; CPU: "; then
    fail "$1 --version prints '$out'"
  fi
  # An unknown flag is an error (mlaserve-microbench would otherwise run every benchmark).
  "$bin_dir/$1" --no_such_flag >/dev/null 2>&1
  status=$?
  if [ -n "$3" ] && [ "$status" -ne "$3" ]; then
    fail "$1 --no_such_flag exits $status, not $3"
  elif [ "$status" -eq 0 ]; then
    fail "$1 --no_such_flag exits 0"
  fi
  if [ -n "$4" ]; then  # a flag of the binary's own with a value of the wrong type
    "$bin_dir/$1" "$4" >/dev/null 2>&1
    status=$?
    [ "$status" -eq "$3" ] || fail "$1 $4 exits $status, not $3"
  fi
}
check mlaserve-server '^  --listen (' 1 --layers=many
check mlaserve-loadgen '^  --target (' 2 --duration_s=long
check mlaserve-ctl '^  --target (' 2 --timeout_s=soon
checked="mlaserve-server, mlaserve-loadgen, mlaserve-ctl"
if [ "$bench" = bench ]; then
  check mlaserve-bench '^  --rounds (' 2 --rounds=few
  # google-benchmark prints its own flags, in its own form, and parses them itself.
  check mlaserve-microbench '\[--benchmark_filter=<regex>\]' "" ""
  checked="$checked, mlaserve-bench, mlaserve-microbench"
fi
[ "$failures" -eq 0 ] && echo "help and version: $checked OK"
exit "$failures"
