"""Where hostd's socket is: defined once here for hostd, the controller and the CLI.

Production: :data:`PROD_HOSTD_SOCKET` (the systemd unit's ``RuntimeDirectory``). Dev mode keeps
state under ``./.run`` (:data:`DEV_STATE_DIR`) and the socket in it (:func:`dev_hostd_socket`).
``AIWG_HOSTD_SOCKET`` overrides both. A client started without a socket in mind asks
:func:`find_hostd_socket`, which prefers a dev hostd in the current directory over the system one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PROD_HOSTD_SOCKET = "/run/agentic-sandbox/hostd.sock"
#: Dev mode's state directory (relative to the working directory), hostd's and the controller's.
DEV_STATE_DIR = ".run"
HOSTD_SOCKET_NAME = "hostd.sock"


def dev_hostd_socket(state_dir: str = DEV_STATE_DIR) -> str:
    """The socket a dev hostd listens on: ``<state_dir>/hostd.sock``."""
    return os.path.join(state_dir, HOSTD_SOCKET_NAME)


def find_hostd_socket(env: Mapping[str, str] | None = None) -> str:
    """``$AIWG_HOSTD_SOCKET``, else ``./.run/hostd.sock`` if it exists (a dev hostd), else production."""
    env = os.environ if env is None else env
    if env.get("AIWG_HOSTD_SOCKET"):
        return env["AIWG_HOSTD_SOCKET"]
    dev = dev_hostd_socket()
    if os.path.exists(dev):
        return os.path.abspath(dev)
    return PROD_HOSTD_SOCKET
