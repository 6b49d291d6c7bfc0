#!/bin/bash
# Installs mlaserve-server as a systemd service (docs/deploy.md):
#   PREFIX/bin/mlaserve-server, PREFIX/bin/mlaserve-health, PREFIX/bin/mlaserve-ctl,
#   PREFIX/share/mlaserve/profiles/,
#   PREFIX/share/doc/mlaserve/ (the units, the example flags, deploy.md),
#   /etc/systemd/system/mlaserve.service, the template mlaserve@.service (several servers
#   on one host) beside it, and from a build with CUDA the template mlaserve-gpu@.service
#   (one server per NVIDIA GPU, instance = the GPU's number; enabled by hand, docs/deploy.md
#   "On a GPU machine"), and /etc/mlaserve/mlaserve.flags unless it exists (per-instance flag
#   files are yours to write).
# Safe to run again: it updates what it owns and never touches an existing flag file. A build
# without CUDA removes an mlaserve-gpu@.service installed before, and refuses to install while
# an instance of it is enabled (it could not start).
#
# Usage: deploy/install.sh [--no-build]
#   PREFIX     install prefix (default /usr/local)
#   DESTDIR    staging root prepended to every path (packaging, tests); no daemon-reload then
#   GPU        1: the CUDA build (build-gpu/, `cmake --preset gpu` if not configured); 0: the
#              CPU one (build/); unset: build-gpu/ if it is configured with CUDA, else build/
#   BUILD_DIR  the CMake build tree (default: as GPU says)
#   JOBS       parallel compile jobs (default: all cores)
#   --no-build install what BUILD_DIR holds; fail if it is not built for PREFIX
set -euo pipefail

source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
GPU=${GPU:-}
build=1
gpu_unit=mlaserve-gpu@.service

die() { echo "install.sh: $*" >&2; exit 1; }

for arg in "$@"; do
  case $arg in
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done
case $PREFIX in
  /*) ;;
  *) die "PREFIX must be an absolute path, not '$PREFIX'" ;;
esac
[ "$PREFIX" = / ] || PREFIX=${PREFIX%/}
case $GPU in
  ""|0|1) ;;
  *) die "GPU must be 1, 0 or unset, not '$GPU'" ;;
esac
if [ -n "$DESTDIR" ]; then
  case $DESTDIR in /*) ;; *) DESTDIR=$PWD/$DESTDIR ;; esac
  export DESTDIR
fi

cached() {  # cached NAME [DIR]: the value of NAME in DIR's (BUILD_DIR's) CMakeCache.txt
  sed -n "s/^$1:[A-Z]*=//p" "${2:-$BUILD_DIR}/CMakeCache.txt" 2>/dev/null || true
}
configured_prefix() { cached CMAKE_INSTALL_PREFIX; }

gpu_tree=$source_dir/build-gpu
if [ -z "${BUILD_DIR:-}" ]; then
  if [ "$GPU" = 1 ] || { [ -z "$GPU" ] && [ "$(cached MLASERVE_HAVE_CUDA "$gpu_tree")" = ON ]; }; then
    BUILD_DIR=$gpu_tree
  else
    BUILD_DIR=$source_dir/build
  fi
fi

# The binary has its profile directory compiled in from the configure-time prefix, so the
# build must be configured for the prefix it is installed to.
if [ "$build" = 1 ]; then
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    if [ "$BUILD_DIR" = "$source_dir/build" ]; then
      (cd "$source_dir" && cmake --preset default -DCMAKE_INSTALL_PREFIX="$PREFIX")
    elif [ "$BUILD_DIR" = "$gpu_tree" ]; then
      (cd "$source_dir" && cmake --preset gpu -DCMAKE_INSTALL_PREFIX="$PREFIX")
    else
      cmake -S "$source_dir" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_INSTALL_PREFIX="$PREFIX"
    fi
  elif [ "$(configured_prefix)" != "$PREFIX" ]; then
    echo "install.sh: $BUILD_DIR is configured for prefix '$(configured_prefix)'; reconfiguring for $PREFIX"
    cmake -S "$source_dir" -B "$BUILD_DIR" -DCMAKE_INSTALL_PREFIX="$PREFIX"
  fi
  # Only what gets installed; the test suites are not needed for that.
  cmake --build "$BUILD_DIR" --target mlaserve-server mlaserve-ctl -j "${JOBS:-$(nproc)}"
else
  for binary in mlaserve-server mlaserve-ctl; do
    [ -x "$BUILD_DIR/bin/$binary" ] || die "$BUILD_DIR/bin/$binary is not built"
  done
  # The units are made when the tree is configured: one configured by an older source lacks
  # the newer ones.
  for unit in mlaserve.service mlaserve@.service $gpu_unit; do
    [ -f "$BUILD_DIR/deploy/$unit" ] ||
      die "$BUILD_DIR/deploy/$unit is missing (configured by an older source?); run without --no-build"
  done
  [ "$(configured_prefix)" = "$PREFIX" ] ||
    die "$BUILD_DIR is configured for prefix '$(configured_prefix)', not $PREFIX; run without --no-build"
fi

# mlaserve-gpu@N runs the server on --devices=cuda:0, which a build without CUDA refuses at
# every start: only a CUDA build installs the template, and an instance enabled for an earlier
# CUDA build stops this one (it would fail from now on) instead of being left to fail.
cuda=$(cached MLASERVE_HAVE_CUDA)
units="mlaserve.service mlaserve@.service"
if [ "$cuda" = ON ]; then
  units="$units $gpu_unit"
else
  [ "$GPU" != 1 ] || die "GPU=1, but $BUILD_DIR is configured without CUDA (MLASERVE_HAVE_CUDA=${cuda:-unset}), so mlaserve-gpu@N could not start: build it with 'make build-gpu' (README, \"On a GPU machine\"), or leave BUILD_DIR to GPU=1"
  enabled=$(cd "$DESTDIR/etc/systemd/system" 2>/dev/null &&
            ls -d -- */mlaserve-gpu@*.service 2>/dev/null | sed 's|.*/||' | sort -u | tr '\n' ' ' || true)
  [ -z "$enabled" ] || die "${enabled% } enabled, but $BUILD_DIR has no CUDA: those instances could not start. Install a CUDA build ('make install GPU=1'), or disable them first (systemctl disable --now ${enabled% })"
fi

cmake --install "$BUILD_DIR" --prefix "$PREFIX"

# The units and the configuration go to /etc whatever the prefix: systemd reads units from
# /etc/systemd/system, and the units name /etc/mlaserve/mlaserve.flags.
etc=$DESTDIR/etc
install -d -m 0755 "$etc/systemd/system" "$etc/mlaserve"
for unit in $units; do
  install -m 0644 "$BUILD_DIR/deploy/$unit" "$etc/systemd/system/$unit"
  echo "-- Installing: $etc/systemd/system/$unit"
done
if [ "$cuda" != ON ]; then
  if [ -e "$etc/systemd/system/$gpu_unit" ]; then
    rm -f -- "$etc/systemd/system/$gpu_unit"
    echo "-- Removed: $etc/systemd/system/$gpu_unit (this build has no CUDA)"
  fi
  echo "No $gpu_unit: $BUILD_DIR has no CUDA. For one server per NVIDIA GPU: make install GPU=1 (README, \"On a GPU machine\")"
fi
if [ -e "$etc/mlaserve/mlaserve.flags" ]; then
  echo "-- Kept: $etc/mlaserve/mlaserve.flags (yours; the example is $DESTDIR$PREFIX/share/doc/mlaserve/mlaserve.flags)"
else
  # Readable by the service's dynamic user, which owns nothing.
  install -m 0644 "$source_dir/deploy/mlaserve.flags" "$etc/mlaserve/mlaserve.flags"
  echo "-- Installing: $etc/mlaserve/mlaserve.flags"
fi

if [ -z "$DESTDIR" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl daemon-reload
  echo "Installed. Start it with: systemctl enable --now mlaserve"
  if [ -e /dev/nvidiactl ] && [ "$cuda" = ON ]; then
    echo "NVIDIA GPUs here: one server per GPU N is mlaserve-gpu@N, with its flags in /etc/mlaserve/gpuN.flags (docs/deploy.md, \"On a GPU machine\")"
  fi
  if systemctl is-active --quiet mlaserve; then
    echo "mlaserve is running the previous binary; switch with: systemctl restart mlaserve"
  fi
else
  echo "Installed. systemd is not running here${DESTDIR:+ (or this is a DESTDIR staging)}: no daemon-reload."
fi
