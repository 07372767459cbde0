"""Typing into a PTY session through hostd, as a person at its shell would."""

from __future__ import annotations

import trio

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd


async def type_into_a_session(socket_path: str, instance_id: str) -> bytes:
    """Start ``sh`` in a PTY session of the instance, type a command, return what came back (up to
    its answer); the session is deleted after."""
    async with open_hostd(socket_path, client_name="test") as client:
        session = (await client.call(m.SessionCreateRequest(instance_id=instance_id, argv=["sh"]))).session
        await client.call(m.SessionWriteRequest(session_id=session.session_id, data=b"echo $((40+2))-typed\n"))
        out = b""
        with trio.fail_after(20):
            async with client.stream(m.SessionSubscribeRequest(session_id=session.session_id, from_seq=1)) as events:
                async for ev in events:
                    if isinstance(ev, m.SessionOutput):
                        out += ev.data
                        if b"42-typed" in out:
                            break
        await client.call(m.SessionDeleteRequest(session_id=session.session_id))
        return out
