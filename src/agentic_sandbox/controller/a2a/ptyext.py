"""pty-extensions/v1 on the AgentCard: the params say what the PTY binding (``controller/pty/``) does.

The extension is used on the PTY attach WebSocket (``/agents/{id}/sessions/{session_id}/attach``,
activated in the first frame's ``extensions``), never on the HTTP bindings: an A2A HTTP request
that activates it is refused (spec §5.2, see :func:`controller.a2a.edge.activate_extensions`).

Every param is read from the module that implements it, so the card cannot drift from the binding:
roles and keyframe cadence from :mod:`controller.pty.rooms`, the default terminal size from
:mod:`controller.instances.sessions`. The replay buffer is hostd's output ring of each session, which keeps
the last ``AIWG_RING_FRAMES`` frames (default 1000) for as long as the session lives, with no
age limit, so 24 h of retention holds unless the frame bound is reached first.
"""

from __future__ import annotations

from typing import Any

from ..instances.sessions import DEFAULT_COLS, DEFAULT_ROWS
from ..pty import rooms
from ..pty.frames import PTY_EXTENSIONS_URI

#: hostd's default ``AIWG_RING_FRAMES`` (hostd/config.py); the controller cannot ask hostd for it.
REPLAY_BUFFER_FRAMES = 1000
REPLAY_RETENTION_S = 86400


def card_extension() -> dict[str, Any]:
    return {
        "uri": PTY_EXTENSIONS_URI,
        "description": (
            "Shared PTY sessions (controller and observer roles, keyframes, replay) on the attach WebSocket "
            "/agents/{instance_id}/sessions/{session_id}/attach; activate it in the first frame's extensions. "
            "It cannot be activated on the HTTP bindings."
        ),
        # required: false, left out: the card holds no false outside the capability flags (card.py).
        "params": {
            "max_controllers": rooms.MAX_CONTROLLERS,
            "max_observers": rooms.MAX_MEMBERS - rooms.MAX_CONTROLLERS,
            "keyframe_interval_seconds": int(rooms.KEYFRAME_INTERVAL_S),
            "keyframe_interval_frames": rooms.KEYFRAME_FRAMES,
            "replay_buffer_frames": REPLAY_BUFFER_FRAMES,
            "replay_buffer_retention_seconds": REPLAY_RETENTION_S,
            "default_cols": DEFAULT_COLS,
            "default_rows": DEFAULT_ROWS,
        },
    }
