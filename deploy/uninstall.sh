#!/bin/bash
# Removes what deploy/install.sh installed, stopping and disabling the service and every
# instance of its templates (mlaserve@NAME, mlaserve-gpu@N) first. The configuration in
# /etc/mlaserve (the per-instance flag files too) stays unless --purge is given.
#
# Usage: deploy/uninstall.sh [--purge]
#   PREFIX   the prefix it was installed to (default /usr/local)
#   DESTDIR  the staging root it was installed under, if any
set -euo pipefail

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
purge=0
for arg in "$@"; do
  case $arg in
    --purge) purge=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "uninstall.sh: unknown argument '$arg' (see --help)" >&2; exit 1 ;;
  esac
done
[ "$PREFIX" = / ] || PREFIX=${PREFIX%/}

systemd_running=0
if [ -z "$DESTDIR" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemd_running=1
  # A stop is the usual graceful drain (SIGTERM).
  systemctl disable --now mlaserve 2>/dev/null || true
  # And every instance of the templates (mlaserve@NAME, mlaserve-gpu@N) that is loaded.
  for instance in $(systemctl list-units --all --plain --no-legend 'mlaserve@*.service' \
                      'mlaserve-gpu@*.service' | awk '{print $1}'); do
    systemctl disable --now "$instance" 2>/dev/null || true
  done
fi

remove() {
  for path in "$@"; do
    if [ -e "$path" ] || [ -L "$path" ]; then
      rm -rf -- "$path"
      echo "-- Removed: $path"
    fi
  done
}

root=$DESTDIR$PREFIX
remove "$root/bin/mlaserve-server" "$root/bin/mlaserve-health" "$root/bin/mlaserve-ctl" "$root/share/mlaserve" \
       "$root/share/doc/mlaserve"
# The enablement link too, for when systemctl could not disable it (no systemd running).
remove "$DESTDIR/etc/systemd/system/mlaserve.service" \
       "$DESTDIR/etc/systemd/system/multi-user.target.wants/mlaserve.service" \
       "$DESTDIR/etc/systemd/system/mlaserve@.service" \
       "$DESTDIR"/etc/systemd/system/multi-user.target.wants/mlaserve@*.service \
       "$DESTDIR/etc/systemd/system/mlaserve-gpu@.service" \
       "$DESTDIR"/etc/systemd/system/multi-user.target.wants/mlaserve-gpu@*.service
if [ "$purge" = 1 ]; then
  remove "$DESTDIR/etc/mlaserve"
elif [ -d "$DESTDIR/etc/mlaserve" ]; then
  echo "-- Kept: $DESTDIR/etc/mlaserve (remove it with --purge)"
fi

if [ "$systemd_running" = 1 ]; then
  systemctl daemon-reload
  systemctl reset-failed mlaserve 2>/dev/null || true
fi
