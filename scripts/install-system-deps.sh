#!/usr/bin/env bash
# Installs the Debian packages the suite and `make run` need. Idempotent: it does
# nothing when every package is already present, so `make test` can call it each time.
set -euo pipefail

PACKAGES=(
  python3-venv python3-dev gcc  # the project's .venv, and building libvirt-python
  podman runc            # container runtime tests (runc: crun refuses cgroup v1/hybrid hosts)
  busybox-static         # rootfs for locally built container images (no pulls here)
  libvirt-dev pkg-config # building libvirt-python; test:///default needs no daemon
  libvirt-daemon-system qemu-system-x86  # real VMs (libvirtd + virtlogd, QEMU)
  linux-image-cloud-amd64 qemu-guest-agent  # the tiny guest image (scripts/build-guest-image.py)
  systemd                # systemd-analyze verify for the unit files
  procps util-linux      # ps, setpriv (tests run a client under another uid)
  tmux                   # the terminal clients are tested inside a real tmux
  chromium chromium-driver  # the web console's browser tests (a real headless Chromium)
  postgresql             # the shared store (AIWG_DATABASE_URL): a private cluster per test run
)
# Node and npm install xterm.js for the web console (scripts/build-console.py); any node/npm on the
# PATH will do (a NodeSource nodejs bundles npm), else Debian's.
command -v node >/dev/null 2>&1 || PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "installing system packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
