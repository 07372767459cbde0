"""The container runtime through podman: ``provider`` (the Provider), ``copies`` (forks and warm pool
slots), ``labels`` (what hostd marks containers with and reads back), ``connection`` (the podman API
socket and the service hostd may start on it), ``images`` (the image catalog)."""
