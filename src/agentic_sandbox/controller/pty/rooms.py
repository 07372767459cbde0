"""The controller's view of who is attached to each PTY session: members, roles, the screen.

A :class:`Room` exists while at least one socket is attached to its session (:meth:`Rooms.enter`).
It holds the members (controllers and observers, ``max_controllers`` of the former), broadcasts
membership, resize and keyframe frames into each member's :class:`~controller.pty.outbox.Outbox`,
and keeps the session's :class:`~controller.pty.screen.Screen` for keyframes. Output itself does not
pass through the room: each socket has its own hostd subscription, so replay positions differ per
client and a slow client slows no one else.

The screen is fed by the members' own subscriptions (:meth:`Room.offer`: the first feed to see the
next sequence gives it to the screen), so live output crosses the hostd link once per member, not
once more for the screen. It reads the session back itself (:meth:`Room.catch_up`, a subscription
that ends once it reaches what the members have seen) only when the room opens, from up to
:data:`SCREEN_BOOT_FRAMES` back, and when the members' feeds skipped output the screen never got
(every member was behind).

Resource handling: the catch-up and the keyframe cadence run in the nursery given to
:meth:`Rooms.attach` (the app's), not in any socket's, and are cancelled when the last member
leaves; the room is then forgotten. Nothing here survives a controller restart, and nothing needs
to: a reconnecting client joins a new room and replays from hostd.

Keyframes: every :data:`KEYFRAME_FRAMES` output frames or :data:`KEYFRAME_INTERVAL_S` of activity,
at most one per :data:`KEYFRAME_MIN_GAP_S` (each costs pyte work on up to the screen's tail),
computed and broadcast by the room's cadence task, never in a member's feed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field

import trio

from agentic_sandbox.proto import HostdClient
from agentic_sandbox.proto import messages as m

from ..errors import ControllerError, Unavailable
from ..hostlink import HostdLink, follow_session
from . import frames as f
from .lanes import Outbox
from .screen import Screen

log = logging.getLogger(__name__)

MAX_CONTROLLERS = 1
MAX_MEMBERS = 33  # max_controllers + max_observers (32)
KEYFRAME_FRAMES = 100
KEYFRAME_INTERVAL_S = 5.0
KEYFRAME_MIN_GAP_S = 2.0
#: Output frames the screen pump reads back when a room opens (bounded again by the screen's tail).
SCREEN_BOOT_FRAMES = 200
#: How long a keyframe waits for the screen to catch up with the session.
CATCH_UP_S = 2.0


@dataclass(eq=False)
class Member:
    client_id: str
    label: str | None
    role: str
    may_control: bool
    outbox: Outbox = field(default_factory=Outbox)

    def ref(self) -> f.ClientRef:
        return f.ClientRef(client_id=self.client_id, label=self.label)


class RoomFull(Exception):
    pass


class Room:
    def __init__(self, session_id: str, cols: int, rows: int) -> None:
        self.session_id = session_id
        self.members: dict[str, Member] = {}
        self.screen = Screen(cols, rows)
        #: Set while the screen has everything up to what the members have seen.
        self.caught_up = trio.Event()
        self.caught_up.set()
        self._frames_since_keyframe = 0
        self._last_keyframe = 0.0
        self._keyframe_due = trio.Event()
        #: The newest sequence any member's feed has seen.
        self._latest = 0
        self._catching_up = False
        #: Starts a catch-up from the given sequence (set by :class:`Rooms`).
        self._start_catch_up: Callable[[int], None] = lambda _seq: None
        self.pump_scope = trio.CancelScope()
        #: The session is pending (created unstarted): its first controller starts it
        #: (:func:`controller.pty.launch.start_pending`, one start at a time under ``starting``).
        self.pending = False
        self.starting = trio.Lock()

    # -- membership -----------------------------------------------------------------------------

    def controllers(self) -> list[Member]:
        return [mem for mem in self.members.values() if mem.role == "controller"]

    def _assign(self, member: Member, wanted: str) -> f.RoleAssigned:
        if wanted == "controller" and not member.may_control:
            member.role = "observer"
            return f.RoleAssigned(
                role="observer", client_id=member.client_id, downgraded=True, reason="token lacks pty:control"
            )
        if wanted == "controller" and member.role != "controller" and len(self.controllers()) >= MAX_CONTROLLERS:
            member.role = "observer"
            return f.RoleAssigned(
                role="observer",
                client_id=member.client_id,
                downgraded=True,
                reason=f"the session has its {MAX_CONTROLLERS} controller(s)",
            )
        member.role = wanted
        return f.RoleAssigned(role=wanted, client_id=member.client_id)

    def join(self, member: Member, wanted: str) -> f.RoleAssigned:
        if len(self.members) >= MAX_MEMBERS:
            raise RoomFull(f"the session has {MAX_MEMBERS} members")
        member.role = "observer"
        assigned = self._assign(member, wanted)
        self.members[member.client_id] = member
        return assigned

    def request_role(self, member: Member, wanted: str) -> f.RoleAssigned:
        return self._assign(member, wanted)

    def leave(self, member: Member) -> None:
        self.members.pop(member.client_id, None)

    def membership(self) -> str:
        frame = f.MembershipChanged(
            controllers=[mem.ref() for mem in self.members.values() if mem.role == "controller"],
            observers=[mem.ref() for mem in self.members.values() if mem.role != "controller"],
        )
        return f.session_frame(frame)

    def broadcast(self, item: str) -> None:
        for member in list(self.members.values()):
            member.outbox.put_control(item)

    # -- the screen -----------------------------------------------------------------------------

    async def keyframe(self) -> f.Keyframe:
        with trio.move_on_after(CATCH_UP_S):
            await self.caught_up.wait()
        self._frames_since_keyframe = 0
        self._last_keyframe = trio.current_time()
        snap = await self.screen.snapshot()
        return f.Keyframe(
            snapshot=snap.data,
            snapshot_format=f.SNAPSHOT_FORMAT,
            snapshot_cols=snap.cols,
            snapshot_rows=snap.rows,
            anchor_sequence=snap.anchor,
        )

    def resized(self, cols: int, rows: int) -> None:
        self.screen.resize(cols, rows)
        self.broadcast(f.session_frame(f.Resize(cols=cols, rows=rows)))

    def offer(self, seq: int, data: bytes) -> None:
        """A member's feed saw output ``seq``: the screen takes it if it is the one it needs next.

        Cheap and synchronous (it runs for every output frame of every member): a keyframe that
        falls due is left to the cadence task.
        """
        if seq > self._latest:
            self._latest = seq
        if self._catching_up:
            return  # the catch-up reads it, in order
        expected = self.screen.anchor + 1
        if seq != expected:
            if seq > expected:
                # The screen missed output no member gave it (all were behind): read it back.
                self.begin_catch_up(expected)
            return
        self.screen.add(seq, data)
        self._frames_since_keyframe += 1
        if self._frames_since_keyframe >= KEYFRAME_FRAMES or (
            trio.current_time() - self._last_keyframe >= KEYFRAME_INTERVAL_S
        ):
            self._keyframe_due.set()

    def hold_for_catch_up(self) -> None:
        """From now until a catch-up ends, the screen takes output only from the catch-up."""
        self._catching_up = True
        if self.caught_up.is_set():
            self.caught_up = trio.Event()

    def begin_catch_up(self, start: int) -> None:
        if not self._catching_up:
            self.hold_for_catch_up()
            self._start_catch_up(start)

    async def catch_up(self, client: HostdClient, start: int, target: int) -> None:
        """Read the session from ``start`` into the screen until it has ``target`` and the newest
        sequence a member has seen (or the session's output ended); then members feed it again.
        Raises a ``ControllerError`` (:func:`controller.hostlink.follow_session`)."""
        if start > self.screen.anchor + 1:
            self.screen.lost(start)
        try:
            if start > max(target, self._latest):
                return
            # Output hostd no longer holds is a lag: what the screen lacks is gone from hostd too.
            async with aclosing(follow_session(client, self.session_id, start, lost_as_lag=True)) as events:
                async for event in events:
                    if isinstance(event, m.SessionOutput):
                        if event.seq == self.screen.anchor + 1:
                            self.screen.add(event.seq, event.data)
                        if event.seq >= max(target, self._latest):
                            return
                    elif isinstance(event, m.SessionLagged):
                        self.screen.lost(event.resume_seq)
                        if event.resume_seq > max(target, self._latest):
                            return
        finally:
            self._catching_up = False
            self.caught_up.set()

    async def cadence(self) -> None:
        """Broadcast a keyframe whenever one falls due (see :meth:`offer`), at most one per
        :data:`KEYFRAME_MIN_GAP_S`."""
        self._last_keyframe = trio.current_time()
        while True:
            await self._keyframe_due.wait()
            await trio.sleep_until(self._last_keyframe + KEYFRAME_MIN_GAP_S)
            keyframe = await self.keyframe()  # what made it due starts over here
            self._keyframe_due = trio.Event()
            self.broadcast(f.session_frame(keyframe))


class Rooms:
    """Every open room, by session id. One per app."""

    def __init__(self, link: HostdLink) -> None:
        self._link = link
        self._rooms: dict[str, Room] = {}
        self._users: dict[str, int] = {}
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def get(self, session_id: str) -> Room | None:
        return self._rooms.get(session_id)

    @asynccontextmanager
    async def enter(self, info: m.SessionInfo) -> AsyncIterator[Room]:
        """The session's room, opened (and its screen pump started) by the first socket."""
        sid = info.session_id
        room = self._rooms.get(sid)
        if room is None:
            room = Room(sid, info.cols, info.rows)
            room.pending = info.pending
            self._rooms[sid] = room
            self._start_pump(room, info)
        else:
            room.pending = room.pending and info.pending  # started meanwhile by another hostd client
        self._users[sid] = self._users.get(sid, 0) + 1
        try:
            yield room
        finally:
            self._users[sid] -= 1
            if self._users[sid] == 0:
                del self._users[sid]
                del self._rooms[sid]
                room.pump_scope.cancel()

    def _start_pump(self, room: Room, info: m.SessionInfo) -> None:
        link = self._link
        if self._nursery is None:
            raise Unavailable("internal.unavailable", "the PTY rooms are not attached to a nursery yet")
        target = info.next_seq - 1
        boot = max(info.first_seq, info.next_seq - SCREEN_BOOT_FRAMES)
        room.screen.anchor = boot - 1
        room.hold_for_catch_up()  # keyframes wait for the boot below; members' output too

        async def catch_up(start: int) -> None:
            try:
                await room.catch_up(link.client(), start, target)
            except ControllerError as exc:
                # Keyframes then show what the screen had; the sockets report hostd themselves.
                log.info("screen of session %s stopped catching up: %s", room.session_id, exc)

        async def run() -> None:
            with room.pump_scope:
                async with trio.open_nursery() as nursery:
                    room._start_catch_up = lambda start: nursery.start_soon(catch_up, start)
                    nursery.start_soon(catch_up, boot)
                    await room.cadence()

        self._nursery.start_soon(run)
