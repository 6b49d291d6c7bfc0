#!/bin/sh
# Every binary answers --help with its own flags and --version with the version and its matrix
# path, both on stdout with exit status 0 (scripts and packagers call them that way).
#   help_version_test.sh BIN_DIR VERSION
set -u
bin_dir="$1"
version="$2"
failures=0
check() {  # binary, a flag its --help must list
  if ! help=$("$bin_dir/$1" --help 2>&1); then
    echo "FAIL: $1 --help exits $?"; failures=$((failures + 1))
  elif ! printf '%s\n' "$help" | grep -q -- "  --$2 ("; then
    echo "FAIL: $1 --help does not list --$2"; failures=$((failures + 1))
  elif printf '%s\n' "$help" | grep -q -- "--fromenv"; then
    echo "FAIL: $1 --help lists abseil's own flags"; failures=$((failures + 1))
  fi
  if ! out=$("$bin_dir/$1" --version 2>&1); then
    echo "FAIL: $1 --version exits $?"; failures=$((failures + 1))
  elif ! printf '%s\n' "$out" | grep -q "^$1 $version (matrix unit: .*; CPU: "; then
    echo "FAIL: $1 --version prints '$out'"; failures=$((failures + 1))
  fi
  # An unknown flag is still an error.
  if "$bin_dir/$1" --no_such_flag >/dev/null 2>&1; then
    echo "FAIL: $1 --no_such_flag exits 0"; failures=$((failures + 1))
  fi
}
check mlaserve-server listen
check mlaserve-loadgen target
check mlaserve-bench rounds
check mlaserve-ctl target
[ "$failures" -eq 0 ] && echo "help and version: every binary OK"
exit "$failures"
