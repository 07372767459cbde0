#!/usr/bin/env bash
# Installs the systemd units, the sysusers.d and the tmpfiles.d snippets (what `make install` runs).
#
#   DESTDIR   staging root for packaging (default: empty = this system). With DESTDIR set,
#             nothing is activated: no systemd-sysusers, systemd-tmpfiles or daemon-reload.
#   PREFIX    where sysusers.d/tmpfiles.d live below (default /usr: /usr/lib/sysusers.d, ...).
#   BINDIR    where agentic-hostd and agentic-controller are, written into the units' ExecStart=
#             lines. Default $PREFIX/bin; without DESTDIR, if that has no agentic-hostd but this
#             checkout's .venv/bin does (`make install`), the venv is used and the script says so.
#   UNITDIR   where units go (default /etc/systemd/system).
#
# Activation (sysusers, tmpfiles, daemon-reload) runs only when systemd is PID 1 (sd_booted(3):
# /run/systemd/system exists); otherwise the script says what it skipped.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$here/systemd"

DESTDIR="${DESTDIR:-}"
PREFIX="${PREFIX:-/usr}"
BINDIR_GIVEN="${BINDIR:+yes}"
BINDIR="${BINDIR:-$PREFIX/bin}"
UNITDIR="${UNITDIR:-/etc/systemd/system}"
SYSUSERSDIR="$PREFIX/lib/sysusers.d"
TMPFILESDIR="$PREFIX/lib/tmpfiles.d"

say() { printf 'install-units: %s\n' "$*"; }

install_unit() {
    local name="$1" binary="$2"
    local target="$DESTDIR$UNITDIR/$name"
    install -d -m 0755 "$DESTDIR$UNITDIR"
    # The units name /usr/bin/...; point ExecStart= at BINDIR instead.
    sed "s|^ExecStart=/usr/bin/$binary\\b|ExecStart=$BINDIR/$binary|" "$src/$name" >"$target.tmp"
    chmod 0644 "$target.tmp"
    mv -f "$target.tmp" "$target"
    say "installed $target (ExecStart=$BINDIR/$binary)"
    if [ -z "$DESTDIR" ] && [ ! -x "$BINDIR/$binary" ]; then
        say "warning: $BINDIR/$binary does not exist; set BINDIR (e.g. BINDIR=$here/.venv/bin)"
    fi
}

if [ -z "$DESTDIR" ] && [ -z "$BINDIR_GIVEN" ] && [ ! -x "$BINDIR/agentic-hostd" ] \
    && [ -x "$here/.venv/bin/agentic-hostd" ]; then
    BINDIR="$here/.venv/bin"
    say "BINDIR not given and $PREFIX/bin/agentic-hostd missing: using this checkout's venv, BINDIR=$BINDIR"
fi
case "$BINDIR" in
    /home/* | /root/*)
        say "warning: BINDIR=$BINDIR is hidden from agentic-controller by its ProtectHome=yes" ;;
esac

install_unit agentic-hostd.service agentic-hostd
install_unit agentic-controller.service agentic-controller
install -D -m 0644 "$src/agentic-sandbox.sysusers.conf" "$DESTDIR$SYSUSERSDIR/agentic-sandbox.conf"
say "installed $DESTDIR$SYSUSERSDIR/agentic-sandbox.conf"
install -D -m 0644 "$src/agentic-sandbox.tmpfiles.conf" "$DESTDIR$TMPFILESDIR/agentic-sandbox.conf"
say "installed $DESTDIR$TMPFILESDIR/agentic-sandbox.conf"

if [ -n "$DESTDIR" ]; then
    say "DESTDIR is set: skipped systemd-sysusers, systemd-tmpfiles --create and daemon-reload (the package's scripts run them)"
    exit 0
fi

if [ -d /run/systemd/system ]; then
    systemd-sysusers "$SYSUSERSDIR/agentic-sandbox.conf"
    say "ran systemd-sysusers"
    systemd-tmpfiles --create "$TMPFILESDIR/agentic-sandbox.conf"
    say "ran systemd-tmpfiles --create"
else
    say "systemd is not PID 1: skipped systemd-sysusers $SYSUSERSDIR/agentic-sandbox.conf"
    say "systemd is not PID 1: skipped systemd-tmpfiles --create $TMPFILESDIR/agentic-sandbox.conf"
fi

if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    say "ran systemctl daemon-reload; start with: systemctl enable --now agentic-hostd agentic-controller"
else
    say "systemd is not PID 1: skipped systemctl daemon-reload"
fi
