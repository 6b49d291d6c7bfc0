#!/bin/bash
# Installs mlaserve-server as a systemd service (docs/deploy.md):
#   PREFIX/bin/mlaserve-server, PREFIX/bin/mlaserve-health, PREFIX/bin/mlaserve-ctl,
#   PREFIX/share/mlaserve/profiles/,
#   PREFIX/share/doc/mlaserve/ (the units, the example flags, deploy.md),
#   /etc/systemd/system/mlaserve.service, the templates mlaserve@.service (several servers
#   on one host) and mlaserve-gpu@.service (one server per NVIDIA GPU, instance = the GPU's
#   number; enabled by hand, docs/deploy.md "On a GPU machine") beside it, and
#   /etc/mlaserve/mlaserve.flags unless it exists (per-instance flag files are yours to write).
# Safe to run again: it updates what it owns and never touches an existing flag file.
#
# Usage: deploy/install.sh [--no-build]
#   PREFIX     install prefix (default /usr/local)
#   DESTDIR    staging root prepended to every path (packaging, tests); no daemon-reload then
#   BUILD_DIR  the CMake build tree (default build/ in the source tree)
#   JOBS       parallel compile jobs (default: all cores)
#   --no-build install what BUILD_DIR holds; fail if it is not built for PREFIX
set -euo pipefail

source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
BUILD_DIR=${BUILD_DIR:-$source_dir/build}
build=1
units="mlaserve.service mlaserve@.service mlaserve-gpu@.service"

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
if [ -n "$DESTDIR" ]; then
  case $DESTDIR in /*) ;; *) DESTDIR=$PWD/$DESTDIR ;; esac
  export DESTDIR
fi

configured_prefix() {
  sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null || true
}

# The binary has its profile directory compiled in from the configure-time prefix, so the
# build must be configured for the prefix it is installed to.
if [ "$build" = 1 ]; then
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    if [ "$BUILD_DIR" = "$source_dir/build" ]; then
      (cd "$source_dir" && cmake --preset default -DCMAKE_INSTALL_PREFIX="$PREFIX")
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
  for unit in $units; do
    [ -f "$BUILD_DIR/deploy/$unit" ] ||
      die "$BUILD_DIR/deploy/$unit is missing (configured by an older source?); run without --no-build"
  done
  [ "$(configured_prefix)" = "$PREFIX" ] ||
    die "$BUILD_DIR is configured for prefix '$(configured_prefix)', not $PREFIX; run without --no-build"
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
  if [ -e /dev/nvidiactl ]; then
    echo "NVIDIA GPUs here: one server per GPU N is mlaserve-gpu@N, with its flags in /etc/mlaserve/gpuN.flags (docs/deploy.md, \"On a GPU machine\")"
  fi
  if systemctl is-active --quiet mlaserve; then
    echo "mlaserve is running the previous binary; switch with: systemctl restart mlaserve"
  fi
else
  echo "Installed. systemd is not running here${DESTDIR:+ (or this is a DESTDIR staging)}: no daemon-reload."
fi
