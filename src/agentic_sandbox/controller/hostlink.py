"""The controller's one connection to hostd, kept open in the background.

Resource handling: :meth:`HostdLink.run` is a service started with ``nursery.start`` in the app's
nursery; it owns the proto client (one multiplexed connection), reconnects with exponential backoff
(capped by ``reconnect_max_s``) and runs the ``on_connected`` hooks after every (re)connect. It ends
only when cancelled.

Error handling: this is the controller's edge toward hostd, so the proto ``HostdError`` family is
translated here, once (:func:`hostd_failure`), into :mod:`controller.errors`; no service sees a
proto error. :meth:`call` fails closed: when the link is down it raises
:class:`~controller.errors.Unavailable` (``internal.unavailable``) at once with the reason the link
went down; it never queues, waits for a reconnect, or retries. A timeout, a dropped connection or a
reply we cannot trust is :class:`~controller.errors.OutcomeUnknown` (the call may have taken
effect); an explicit hostd error keeps its meaning where it names a caller mistake (unknown
instance, wrong state, bad working dir, ...), hostd at one of its limits is
:class:`~controller.errors.LimitReached` (``limit.<name>``: the limit, its setting and whether
waiting helps, from the :class:`proto.Limit` in the answer's details), and anything else is
``internal.unavailable``. The hostd
code is kept in ``details["hostd_code"]`` and the proto error as ``__cause__``. A ping every
``ping_interval_s`` notices a peer that is connected but hung (the ping's deadline passes): the link
drops the connection, reports not ready with the reason, and reconnects. ``ready`` and ``reason``
feed ``/readyz``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from agentic_sandbox.proto import (
    ErrorCode,
    EventStream,
    HostdClient,
    HostdError,
    HostdNotRunning,
    HostdRemoteError,
    HostdRestarting,
    HostdStreamOverflow,
    HostdTimeout,
    Limit,
    current_log_ids,
    open_hostd,
)
from agentic_sandbox.proto import messages as m

from .errors import (
    Conflict,
    ControllerError,
    InvalidState,
    LimitReached,
    NotFound,
    OperationFailed,
    OutcomeUnknown,
    Unavailable,
    Unimplemented,
    ValidationFailed,
)

if TYPE_CHECKING:
    from .metrics import Metrics

log = logging.getLogger(__name__)

INITIAL_BACKOFF_S = 0.05
BROKEN_POLL_S = 0.05


UNAVAILABLE = "internal.unavailable"
#: hostd hands over to a new image of itself: what failed with it was not done; send it again.
RESTARTING = "hostd.restarting"
#: How long an attached terminal or a write waits for hostd back from an upgrade in place (its new
#: image answers within a second): past it, the client is told, as for any hostd outage.
RESUME_WITHIN_S = 10.0
#: hostd at a limit it did not name (an older hostd).
LIMIT_REACHED = "limit.reached"


RemoteFailure = Callable[[HostdRemoteError, dict[str, str]], ControllerError]


def _as(
    cls: type[NotFound | Conflict | InvalidState | OperationFailed | Unavailable | Unimplemented], code: str
) -> RemoteFailure:
    return lambda exc, details: cls(code, exc.message, details=details)


def _invalid(field: str | None) -> RemoteFailure:
    """A request hostd refused as invalid: naming the field it concerns, where there is one."""

    def make(exc: HostdRemoteError, details: dict[str, str]) -> ControllerError:
        fields = [{"field": field, "message": exc.message, "code": exc.code}] if field else []
        return ValidationFailed(fields, exc.message, details=details)

    return make


def _limit_reached(exc: HostdRemoteError, details: dict[str, str]) -> ControllerError:
    """hostd at a limit: 429 ``limit.<name>`` with the bound, the setting that raises it and, where
    waiting helps, how long to wait; an older hostd that names no limit: ``limit.reached``."""
    limit = Limit.from_details(exc.details)
    if limit is None:
        return LimitReached(LIMIT_REACHED, exc.message, details=details)
    details = {**details, "limit": str(limit.limit)}
    if limit.setting:
        details["setting"] = limit.setting
        raised_by = f"set by {limit.setting} on hostd"
    else:
        raised_by = "fixed in hostd"
    return LimitReached(
        f"limit.{limit.name}",
        f"{exc.message} (limit {limit.limit}, {raised_by})",
        retry_after_s=limit.retry_after_s or None,
        details=details,
    )


#: hostd's explicit answers and the domain error each becomes: caller mistakes keep their meaning,
#: a full table or queue is a limit (429); a code not here (shutting down, an internal error) fails
#: closed as unavailable.
REMOTE_FAILURES: dict[ErrorCode, RemoteFailure] = {
    ErrorCode.INSTANCE_NOT_FOUND: _as(NotFound, "instance.not_found"),
    ErrorCode.INSTANCE_EXISTS: _as(Conflict, "instance.already_exists"),
    ErrorCode.INSTANCE_INVALID_STATE: _as(InvalidState, "instance.invalid_state"),
    # Asleep, and its policy wants an operator's wake: the caller can do something about it.
    ErrorCode.INSTANCE_SLEEPING: _as(InvalidState, "instance.sleeping"),
    # The wake a request needed failed: hostd's message names the instance and why.
    ErrorCode.INSTANCE_WAKE_FAILED: _as(Unavailable, "instance.wake_failed"),
    ErrorCode.INSTANCE_BUSY: _as(Conflict, "instance.busy"),
    ErrorCode.WORKING_DIR_NOT_FOUND: _invalid("working_dir"),
    ErrorCode.REQUEST_INVALID: _invalid(None),
    ErrorCode.SPAWN_FAILED: _as(OperationFailed, "instance.spawn_failed"),
    # The runtime's provider (podman, libvirt) cannot serve: never another runtime instead.
    ErrorCode.PROVIDER_UNAVAILABLE: _as(Unavailable, "runtime.unavailable"),
    ErrorCode.IMAGE_NOT_FOUND: _invalid("image"),
    ErrorCode.PROVIDER_FAILED: _as(OperationFailed, "runtime.provider_failed"),
    ErrorCode.CHECKPOINT_NOT_FOUND: _as(NotFound, "checkpoint.not_found"),
    ErrorCode.POOL_NOT_FOUND: _as(NotFound, "warm_pool.not_found"),
    ErrorCode.POOL_EMPTY: _as(Conflict, "warm_pool.empty"),
    ErrorCode.UNSUPPORTED: _as(Unimplemented, "capability.unsupported"),
    ErrorCode.SESSION_NOT_FOUND: _as(NotFound, "session.not_found"),
    ErrorCode.SESSION_EXITED: _as(InvalidState, "session.exited"),
    ErrorCode.SESSION_PENDING: _as(InvalidState, "session.pending"),
    ErrorCode.LIMIT_REACHED: _limit_reached,
    ErrorCode.RESTARTING: _as(Unavailable, RESTARTING),
}


def _remote_failure(exc: HostdRemoteError) -> ControllerError:
    """An explicit hostd answer, through :data:`REMOTE_FAILURES`."""
    details = {"hostd_code": exc.code}
    make = REMOTE_FAILURES.get(exc.error_code) if exc.error_code is not None else None
    if make is None:
        return Unavailable(UNAVAILABLE, f"hostd refused the call: {exc.code}: {exc.message}", details=details)
    return make(exc, details)


def hostd_failure(exc: HostdError) -> ControllerError:
    """The domain error for one hostd failure (see the module docstring)."""
    if isinstance(exc, HostdRemoteError):
        return _remote_failure(exc)
    if isinstance(exc, HostdNotRunning):
        return Unavailable(UNAVAILABLE, f"hostd is unavailable: {exc}")
    if isinstance(exc, HostdRestarting):
        # Not an unknown outcome: hostd answered everything it did before it closed.
        return Unavailable(RESTARTING, str(exc), details={"hostd_code": RESTARTING})
    return OutcomeUnknown(UNAVAILABLE, f"hostd is unavailable: {exc}")


class LinkStream:
    """A hostd stream's events with proto errors translated (see :meth:`HostdLink.stream`);
    ``buffered``: how many have arrived and wait (:class:`proto.client.EventStream`)."""

    __slots__ = ("_events",)

    def __init__(self, events: EventStream) -> None:
        self._events = events

    def __aiter__(self) -> LinkStream:
        return self

    async def __anext__(self) -> m.Event:
        try:
            return await self._events.__anext__()
        except HostdError as exc:
            raise hostd_failure(exc) from exc

    async def aclose(self) -> None:
        await self._events.aclose()

    @property
    def buffered(self) -> int:
        return self._events.buffered


async def follow_session(
    client: HostdClient, session_id: str, from_seq: int, *, lost_as_lag: bool = False
) -> AsyncGenerator[m.Event, None]:
    """A session's events (output, lags, its exit) from ``from_seq`` on, until hostd ends the
    stream; every proto failure raises a ``ControllerError`` as :meth:`HostdLink.call` does.

    A stream that overflowed (its consumer fell behind the client's buffer) is opened again where it
    stopped, so the consumer sees one gap-free run. With ``lost_as_lag`` a start older than hostd
    still holds is a ``SessionLagged`` up to the first sequence it holds, as output lost while
    subscribed is; else it is hostd's ``stream.seq_out_of_range``. Close it with ``aclosing``.
    """
    start = from_seq
    while True:
        request = m.SessionSubscribeRequest(session_id=session_id, from_seq=start)
        request.trace_id = current_log_ids().get("request_id")
        try:
            async with client.stream(request) as events:
                async for event in events:
                    if isinstance(event, m.SessionOutput):
                        start = event.seq + 1
                    elif isinstance(event, m.SessionLagged):
                        start = event.resume_seq
                    yield event
            return
        except HostdStreamOverflow:
            continue
        except HostdRemoteError as exc:
            first = exc.details.get("first_seq")
            lost = exc.error_code is ErrorCode.SEQ_OUT_OF_RANGE and isinstance(first, int) and first > start
            if not (lost_as_lag and lost):
                raise hostd_failure(exc) from exc
            assert isinstance(first, int)
            yield m.SessionLagged(missed_from=start, resume_seq=first)
            start = first
        except HostdError as exc:
            raise hostd_failure(exc) from exc


def _method(request: m.Request) -> str:
    name = type(request).__name__
    return name[: -len("Request")] if name.endswith("Request") else name


class HostdLink:
    """See the module docstring. One per app."""

    def __init__(
        self,
        socket_path: str,
        *,
        call_timeout_s: float,
        connect_timeout_s: float,
        ping_interval_s: float,
        reconnect_max_s: float,
        metrics: Metrics | None = None,
        client_name: str = "agentic-controller",
    ) -> None:
        self.socket_path = socket_path
        self.call_timeout_s = call_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.ping_interval_s = ping_interval_s
        self.reconnect_max_s = reconnect_max_s
        self.client_name = client_name
        self.metrics = metrics
        self.on_connected: list[Callable[[], Awaitable[object]]] = []
        self._client: HostdClient | None = None
        self._reason: str = "not connected to hostd yet"
        self._changed = trio.Event()
        self.connects = 0
        #: The host and boot hostd's last Hello named (kept while the link is down: the instances
        #: of this host are still this host's). None until the first connect.
        self.host_id: str | None = None
        self.boot_id: str | None = None
        #: The last connection ended with hostd handing over to a new image of itself.
        self._handed_over = False

    # -- state --------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        client = self._client
        return client is not None and client.broken is None and not client.closing

    @property
    def restarting(self) -> bool:
        """hostd is handing over to a new image of itself (calls wait for it, :meth:`call`)."""
        client = self._client
        if client is None:
            return self._handed_over
        return client.closing or isinstance(client.broken, HostdRestarting)

    @property
    def reason(self) -> str | None:
        """Why the link is not ready (None when it is)."""
        client = self._client
        if client is not None and client.broken is not None:
            return f"connection to hostd lost: {client.broken}"
        if client is not None and client.closing:
            return "hostd is restarting in place"
        return None if self.ready else self._reason

    def require_host(self, instance_id: str, host_id: str | None) -> None:
        """Refuse to act here on an instance of another host (``host_id``; None: not placed yet,
        maybe this host's). The router sends every request about one to its host; this is for what
        it cannot route (the gRPC binding, the legacy PTY listener, the upstream checkpoint verbs
        that name an instance in their body)."""
        if host_id is not None and host_id != self.host_id:
            raise Conflict(
                "instance.other_host",
                f"instance {instance_id} runs on host {host_id}: ask a controller of that host "
                "(GET /api/v2/admin/hosts lists them)",
                details={"host_id": host_id},
            )

    @property
    def hello(self) -> m.HelloResponse | None:
        return self._client.hello if self._client is not None else None

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def require_ready(self) -> None:
        """``Unavailable`` at once when the link is down: a check before work is accepted (an
        operation), so that it is refused rather than failed later."""
        if not self.ready:
            raise Unavailable("internal.unavailable", f"hostd is not reachable: {self.reason}")

    async def wait_ready(self) -> None:
        """Return once the link is connected (callers bound this with their own deadline)."""
        while not self.ready:
            await self._changed.wait()

    async def wait_back(self, deadline: float | None = None) -> bool:
        """Wait for the link until the trio time ``deadline`` (default: :data:`RESUME_WITHIN_S` from
        now; hostd upgrading in place comes back within a second); whether it is connected."""
        with trio.move_on_at(trio.current_time() + RESUME_WITHIN_S if deadline is None else deadline):
            await self.wait_ready()
        return self.ready

    # -- calls --------------------------------------------------------------------------------

    async def call(self, request: m.Request, *, timeout: float | None = None) -> Any:
        """One hostd call with the configured deadline; raises a ``ControllerError`` on any failure.

        While hostd upgrades in place the call waits for its new image, up to :data:`RESUME_WITHIN_S`:
        a call hostd refused with ``hostd.restarting``, or that could not be sent because of the
        handover, was not done, so it is made again there. One the handover cut after hostd took it
        has an unknown outcome and fails as any lost connection does.
        """
        deadline = trio.current_time() + RESUME_WITHIN_S
        while True:
            if self.restarting:
                await self.wait_back(deadline)
            try:
                return await self._call(request, timeout=timeout)
            except HostdError as exc:
                failure = hostd_failure(exc)
                # Refused or never sent because of the handover: not done, so made again there.
                again = failure.code == RESTARTING or (isinstance(exc, HostdNotRunning) and self.restarting)
                if not again or trio.current_time() >= deadline:
                    raise failure from exc

    def client(self) -> HostdClient:
        """The connected client, for streams and posts (callers translate its ``HostdError`` with
        :func:`hostd_failure`); ``Unavailable`` at once when the link is down."""
        client = self._client
        if client is None or client.broken is not None:
            raise Unavailable(UNAVAILABLE, f"hostd is not connected ({self.reason})")
        return client

    @asynccontextmanager
    async def stream(self, request: m.Request) -> AsyncIterator[LinkStream]:
        """A hostd stream (replay then live events) over the link's connection; every failure,
        opening it or while iterating, raises a ``ControllerError`` as :meth:`call` does."""
        client = self._client
        if client is None or client.broken is not None:
            raise hostd_failure(HostdNotRunning(f"hostd is not connected ({self.reason})"))
        if request.trace_id is None:
            request.trace_id = current_log_ids().get("request_id")
        try:
            async with client.stream(request, open_timeout=self.call_timeout_s) as events:
                yield LinkStream(events)
        except HostdError as exc:
            raise hostd_failure(exc) from exc

    async def post(
        self,
        request: m.Request,
        on_error: Callable[[ControllerError], None],
        on_success: Callable[[], None] | None = None,
    ) -> None:
        """Send one request without waiting for its answer (:meth:`HostdClient.post`: the keystroke
        path, where an echo must not wait for the write's reply). An error answered later, or met
        while sending, reaches ``on_error`` translated; a post that cannot be sent at all (the link
        down, too many posts unanswered) raises a ``ControllerError`` and calls neither callback."""
        client = self.client()
        try:
            await client.post(request, lambda exc: on_error(hostd_failure(exc)), on_success)
        except HostdError as exc:
            raise hostd_failure(exc) from exc

    def session_output(
        self, session_id: str, from_seq: int, *, lost_as_lag: bool = False
    ) -> AsyncGenerator[m.Event, None]:
        """:func:`follow_session` over the link's connection; ``Unavailable`` at once (not at the
        first event) when the link is down."""
        return follow_session(self.client(), session_id, from_seq, lost_as_lag=lost_as_lag)

    async def _call(self, request: m.Request, *, timeout: float | None = None) -> Any:
        """The call with proto errors (the link's own ping tells a timeout from the rest)."""
        method = _method(request)
        client = self._client
        if client is None or client.broken is not None:
            error = HostdNotRunning(f"hostd is not connected ({self.reason})")
            if self.metrics is not None:
                self.metrics.observe_hostd(method, 0.0, type(error).__name__)
            raise error
        if request.trace_id is None:
            # hostd logs the call under the id of the HTTP request (or its operation) behind it.
            request.trace_id = current_log_ids().get("request_id")
        started = time.perf_counter()
        error_name: str | None = None
        try:
            return await client.call(request, timeout=self.call_timeout_s if timeout is None else timeout)
        except HostdError as exc:
            error_name = type(exc).__name__
            raise
        finally:
            if self.metrics is not None:
                self.metrics.observe_hostd(method, time.perf_counter() - started, error_name)

    # -- the service --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, watch, reconnect; forever. Reports started at once (not when connected)."""
        task_status.started()
        backoff = INITIAL_BACKOFF_S
        while True:
            try:
                async with open_hostd(
                    self.socket_path, client_name=self.client_name, connect_timeout=self.connect_timeout_s
                ) as client:
                    self._client = client
                    if client.hello is not None:
                        self.host_id, self.boot_id = client.hello.host_id, client.hello.boot_id
                    self.connects += 1
                    self._handed_over = False
                    backoff = INITIAL_BACKOFF_S
                    log.info("connected to hostd at %s (pid %s)", self.socket_path, client.hello and client.hello.pid)
                    self._pulse()
                    await self._run_hooks()
                    self._reason = await self._watch(client)
                    if isinstance(client.broken, HostdRestarting):
                        # Its new image answers on the same socket within a second: no backoff,
                        # and nothing worth a warning.
                        self._handed_over = True
                        log.info("hostd restarts in place; reconnecting")
                        self._pulse()
                        continue
            except* HostdError as group:
                self._reason = "; ".join(str(exc) for exc in group.exceptions)
            finally:
                self._client = None
            if self.metrics is not None:
                self.metrics.hostd_up.set(0)
            # Warn on the transition only; a hostd that stays away would flood the log otherwise.
            level = logging.WARNING if backoff == INITIAL_BACKOFF_S else logging.DEBUG
            log.log(level, "hostd link down: %s (retrying, backoff up to %.2f s)", self._reason, self.reconnect_max_s)
            self._pulse()
            await trio.sleep(backoff)
            backoff = min(backoff * 2, self.reconnect_max_s)

    async def _run_hooks(self) -> None:
        if self.metrics is not None:
            self.metrics.hostd_up.set(1)
        for hook in self.on_connected:
            try:
                await hook()
            except ControllerError as exc:
                log.warning("hostd on-connect hook %s failed: %s", getattr(hook, "__name__", hook), exc)
            except Exception:
                log.exception("hostd on-connect hook %s failed", getattr(hook, "__name__", hook))

    async def _watch(self, client: HostdClient) -> str:
        """Return the reason once the connection broke or a ping went unanswered."""
        ping_timeout = max(min(self.call_timeout_s, 5.0), self.ping_interval_s)
        next_ping = trio.current_time() + self.ping_interval_s
        while client.broken is None:
            now = trio.current_time()
            if client.closing:
                # hostd hands over: its answers to what was sent still come, then it closes. A ping
                # cannot be sent, and leaving now would drop those answers.
                pass
            elif now >= next_ping:
                try:
                    await self._call(m.PingRequest(), timeout=ping_timeout)
                except HostdTimeout:
                    return f"hostd did not answer a ping within {ping_timeout:g} s"
                except HostdError as exc:
                    return f"hostd ping failed: {exc}"
                next_ping = trio.current_time() + self.ping_interval_s
            # The client has no "broken" event; polling it keeps reconnects prompt.
            await trio.sleep(BROKEN_POLL_S)
        return f"connection to hostd lost: {client.broken}"
