"""The VM runtime through libvirt: ``provider`` (the Provider), ``copies`` (forks and warm pool
slots), ``domain`` (the domain XML hostd defines and the metadata that finds it again),
``connection`` (hostd's one libvirt connection), ``bootimage`` (what a VM boots), ``saveimage`` (a
save image given another identity), and the helpers hostd runs as children on a PTY or pipes:
``console`` (the serial console relay) and ``guestexec`` (a command through qemu-guest-agent)."""
