"""sd_listen_fds_with_names(3) without libsystemd: the fds systemd passed us at start.

systemd passes fds (sockets it listens on for us, and what we kept in its file descriptor store
with :func:`hostd.sdnotify.store_fds` before a crash or restart) as fds 3, 4, ... with three
variables: ``LISTEN_PID`` (the process they are for), ``LISTEN_FDS`` (how many) and
``LISTEN_FDNAMES`` (their names, colon separated, in fd order).

Ownership: :func:`take_listen_fds` hands the fds over to the caller, who closes what it does not
use. It marks them close-on-exec and removes the three variables, so no child inherits either
(a child seeing ``LISTEN_FDS`` would take fd 3 for its own). It is meant to be called once, early,
before anything else opens fds or starts processes.

Error handling: variables that are absent or not for us give ``{}``; malformed ones are logged and
give ``{}`` as well, never an exception: a start without the stored fds is a start after a
clean stop, which hostd has to handle anyway.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

#: The first fd systemd passes (SD_LISTEN_FDS_START).
SD_LISTEN_FDS_START = 3
#: The variables systemd sets with the fds; removed once read.
LISTEN_ENV_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
#: The name systemd reports for an fd it has no name for.
UNKNOWN_NAME = "unknown"

# Only digits: int() would also take " 3", "+3" and "1_0", which systemd's parsers refuse.
_NUMBER = re.compile(r"[0-9]+")


def take_listen_fds(env: MutableMapping[str, str] | None = None) -> dict[str, list[int]]:
    """The fds systemd passed to this process, by name, each name's fds in fd order.

    Reads and removes ``LISTEN_PID``/``LISTEN_FDS``/``LISTEN_FDNAMES`` from ``env`` (default
    ``os.environ``, which also unsets them for children), whether or not they were for us.
    """
    return _take_listen_fds(os.environ if env is None else env, SD_LISTEN_FDS_START)


def _take_listen_fds(env: MutableMapping[str, str], start: int) -> dict[str, list[int]]:
    # ``start`` is SD_LISTEN_FDS_START but in tests, which cannot give up their own fd 3.
    raw_pid, raw_fds, raw_names = (env.pop(name, None) for name in LISTEN_ENV_VARS)
    if raw_pid is None or raw_fds is None:
        return {}
    if not _NUMBER.fullmatch(raw_pid) or not _NUMBER.fullmatch(raw_fds):
        log.warning("ignoring malformed LISTEN_PID=%r LISTEN_FDS=%r", raw_pid, raw_fds)
        return {}
    if int(raw_pid) != os.getpid():
        # Inherited from a parent that did not take them: the fds, if any, are not ours.
        return {}
    count = int(raw_fds)
    if count == 0:
        return {}
    fds = range(start, start + count)
    for fd in fds:  # stops at the first fd that is not open, however large the count
        try:
            os.set_inheritable(fd, False)
        except OSError as exc:
            log.warning("ignoring LISTEN_FDS=%d: fd %d: %s", count, fd, exc)
            return {}
    # Like systemd's split, an empty value is no names rather than one empty name.
    names = raw_names.split(":") if raw_names else []
    if len(names) > count:
        # sd_listen_fds_with_names refuses this too; the fds stay open, close-on-exec.
        log.warning("ignoring LISTEN_FDNAMES=%r: %d names for %d fds", raw_names, len(names), count)
        return {}
    names += [UNKNOWN_NAME] * (count - len(names))
    taken: dict[str, list[int]] = {}
    for name, fd in zip(names, fds, strict=True):
        taken.setdefault(name, []).append(fd)
    return taken
