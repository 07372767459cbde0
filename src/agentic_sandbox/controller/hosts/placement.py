"""Which host a new instance goes to.

A provision request may name a host (``host``: its id or name) or a label the host must carry
(``host_label``: ``key=value``, or ``key`` for any value). Among the hosts that match it and offer
the runtime (their hostd's provider is available), a host is a candidate when it is available (a
controller of it reported within ``AIWG_HOST_TIMEOUT_S``), not cordoned, not draining, and below
its ``AIWG_HOST_MAX_INSTANCES`` live instances when it sets one. The policy, in order: the most
memory available in whole GiB (as its last heartbeat said), then the fewest live instances, then
the lowest host id (so two controllers placing at once with the same view choose alike).

No host fits: 404 ``host.not_found`` for a named host the store does not know; 409
``placement.no_host`` when no host carries the label asked for (waiting does not help); 503
``placement.unavailable`` when no host offers the runtime now (its provider, podman or libvirt,
is down or missing), or the hosts that could are unavailable, cordoned, draining or full (the
message names each and why): waiting may help.
"""

from __future__ import annotations

from ..errors import Conflict, NotFound, Unavailable
from ..store import HostRecord

GIB = 1 << 30
#: Instance states that hold a host's resources (what ``AIWG_HOST_MAX_INSTANCES`` counts).
LIVE_STATES = ("provisioning", "starting", "running", "stopping")


def _carries(rec: HostRecord, label: str) -> bool:
    key, eq, value = label.partition("=")
    return rec.labels.get(key) == value if eq else key in rec.labels


def live_instances(counts: dict[str, dict[str, int]], host_id: str) -> int:
    by_state = counts.get(host_id, {})
    return sum(by_state.get(state, 0) for state in LIVE_STATES)


def why_not(rec: HostRecord, live: int, now: float, timeout_s: float) -> str | None:
    """Why a host that could take the instance cannot now; None when it can."""
    if not rec.heard(now, timeout_s):
        return "unavailable"
    if rec.draining:
        return "draining"
    if rec.cordoned:
        return "cordoned"
    if rec.capacity.max_instances and live >= rec.capacity.max_instances:
        return f"full ({live} of {rec.capacity.max_instances} instances)"
    return None


def choose(
    hosts: list[HostRecord],
    counts: dict[str, dict[str, int]],
    *,
    runtime: str,
    host: str | None = None,
    label: str | None = None,
    now: float,
    timeout_s: float,
) -> HostRecord:
    """The host for a new instance of ``runtime`` (as stored: host, docker, qemu); see the module docstring."""
    matching = hosts
    if host is not None:
        matching = [h for h in hosts if host in (h.id, h.name)]
        if not matching:
            raise NotFound("host.not_found", f"no host {host!r} (GET /api/v2/admin/hosts lists them)")
    if label is not None:
        matching = [h for h in matching if _carries(h, label)]
    where = f" among {host!r}" if host is not None else ""
    if not matching:
        raise Conflict("placement.no_host", f"no host{where} carries label {label!r}")
    able = [h for h in matching if runtime in h.runtimes]
    if not able:
        # A runtime is offered while its provider answers (podman, libvirt): it may come back.
        raise Unavailable("placement.unavailable", f"no host{where} offers runtime {runtime!r} now")
    candidates = []
    refused = []
    for rec in able:
        live = live_instances(counts, rec.id)
        reason = why_not(rec, live, now, timeout_s)
        if reason is None:
            # Memory in whole GiB: hosts about as free count as equal, so instances placed within
            # one heartbeat (before the memory they take shows) spread by live instances.
            candidates.append((-(rec.capacity.memory_available_bytes // GIB), live, rec.id, rec))
        else:
            refused.append(f"{rec.name} ({rec.id}): {reason}")
    if not candidates:
        raise Unavailable("placement.unavailable", "no host can take it now: " + "; ".join(refused))
    return min(candidates, key=lambda c: c[:3])[3]
