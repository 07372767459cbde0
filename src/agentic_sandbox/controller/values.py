"""Value types the controller's surfaces share, with no service behind them.

Here so that a wire module (the admin routes' bodies, the pty-ws/v1 frames) can name a value
without importing the service that acts on it (:mod:`controller.instances.sessions` for a session's
working directory).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

#: A working directory as callers give it (absolute, or relative to the instance's working dir).
Cwd = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
