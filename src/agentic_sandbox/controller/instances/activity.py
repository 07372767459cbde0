"""What keeps an instance awake that hostd cannot see, told to hostd in one call at a time.

hostd judges when an instance is idle (docs/sleep.md): it sees the execs, the attached terminals and
the requests it gets. It does not see an A2A request that needs no process (a task read, a card, a
push config), a push delivery still behind, or a task that waits for an answer (``input-required``:
its exec runs, but waits, and must not keep the instance awake). :class:`ActivityReport` gathers
those and sends them as one ``InstanceActivity`` every ``interval_s`` (half a second): the instances that saw a
request or are being pushed to (their idle time starts over), and the execs of the tasks waiting
for an answer (parked; hostd forgets a parking not said again within 30 s).

Cost on the request path: one set insertion (:meth:`ActivityReport.seen`); nothing is sent while
nothing happens. A failed report (hostd away) is dropped: the next one says what is true then.

Resource handling: :meth:`ActivityReport.run` is a service in the app's nursery, started with
``nursery.start``; it ends only when cancelled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import trio

from agentic_sandbox.proto import messages as m

from ..errors import ControllerError
from ..hostlink import HostdLink

log = logging.getLogger(__name__)

#: Twice a second: well inside the shortest idle time hostd accepts (1 s).
INTERVAL_S = 0.5


class ActivityReport:
    """See the module docstring. ``parked`` names the execs of tasks waiting for an answer;
    ``pushing`` the instances with push deliveries behind (both read at each report)."""

    def __init__(
        self,
        link: HostdLink,
        *,
        parked: Callable[[], Iterable[str]],
        pushing: Callable[[], Iterable[str]],
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.link = link
        self.parked = parked
        self.pushing = pushing
        self.interval_s = interval_s
        self._seen: set[str] = set()
        self.reports = 0

    def seen(self, instance_id: str) -> None:
        """A request about the instance came in."""
        self._seen.add(instance_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            await self.report()

    async def report(self) -> None:
        """Send what was gathered since the last report (nothing if nothing happened)."""
        instances = self._seen | set(self.pushing())
        parked = sorted(set(self.parked()))
        if not (instances or parked) or not self.link.ready:
            return
        self._seen = set()
        try:
            await self.link.call(m.InstanceActivityRequest(instance_ids=sorted(instances), parked_execs=parked))
            self.reports += 1
        except ControllerError as exc:
            log.debug("activity report not sent: %s", exc)
