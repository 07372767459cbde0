"""Prometheus metrics of one app, in its own ``CollectorRegistry`` (never the global one).

* ``aiwg_http_requests_total{surface,method,route,status}`` and
  ``aiwg_http_request_duration_seconds{surface,method,route}``: ``route`` is the matched route
  template (``/api/v2/admin/instances/<id>``), never the raw path, so ids do not explode the label
  set; unmatched paths share ``route="<unmatched>"``.
* ``aiwg_hostd_rpc_duration_seconds{method}``, ``aiwg_hostd_rpc_errors_total{method,error}`` and
  ``aiwg_hostd_up``.
* ``aiwg_instances{state}`` (catalog after reconciliation) and ``aiwg_open_sessions`` (hostd's
  running PTY sessions), refreshed when ``/metrics`` is scraped.
* ``aiwg_v1_path_requests_total{path}``: ``path`` is the v1 route template (``/api/v1/vms/{id}``).
* ``aiwg_idempotency_hit_total{operation}`` (upstream's name), ``aiwg_idempotency_miss_total`` and
  ``aiwg_idempotency_collision_total``: idempotency/v1 outcomes of ``SendMessage`` and ``SendStreamingMessage``.
* ``aiwg_operations_total{kind,state}``: operations that ended, by outcome.
* ``aiwg_instance_sleeps_total{runtime,how}``, ``aiwg_instance_wakes_total{runtime,cause}`` and
  ``aiwg_instance_wake_seconds{runtime}`` (hostd's time to wake, one observation per wake seen):
  instances that sleep when idle, as the hostd watch finds them (``aiwg_instances{state="sleeping"}``
  counts those asleep).
* ``aiwg_warm_pool_size{pool}``, ``aiwg_warm_pool_ready{pool}``, ``aiwg_warm_pool_filling{pool}``
  and ``aiwg_warm_pool_{hits,misses,refills,failures}_total{pool}``: each warm pool as hostd keeps it
  (its counters are hostd's, kept across restarts of either process), read at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from agentic_sandbox.proto import messages as m

INSTANCE_STATES = (
    "provisioning",
    "stopped",
    "starting",
    "running",
    "stopping",
    "sleeping",
    "failed",
    "destroying",
    "destroyed",
)
#: From a frozen host instance (a millisecond) to a VM restored from its managed save (seconds).
WAKE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class _WarmPools(Collector):
    """The warm pools of the last scrape's ``PoolList``: gauges and hostd's own counters."""

    GAUGES = (("size", "Slots the pool keeps ready"), ("ready", "Slots ready now"), ("filling", "Slots being made"))
    COUNTERS = (
        ("hits", "Claims served from a ready slot"),
        ("misses", "Claims that found no ready slot"),
        ("refills", "Slots made"),
        ("failures", "Attempts to make a slot that failed"),
    )

    def __init__(self) -> None:
        self.pools: Sequence[m.PoolInfo] = ()

    def collect(self) -> Iterator[Metric]:
        for name, doc in self.GAUGES:
            gauge = GaugeMetricFamily(f"aiwg_warm_pool_{name}", doc, labels=["pool"])
            for pool in self.pools:
                gauge.add_metric([pool.pool], getattr(pool, name))
            yield gauge
        for name, doc in self.COUNTERS:
            counter = CounterMetricFamily(f"aiwg_warm_pool_{name}", doc, labels=["pool"])
            for pool in self.pools:
                counter.add_metric([pool.pool], getattr(pool, name))
            yield counter


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._warm_pools = _WarmPools()
        r.register(self._warm_pools)
        self.http_requests = Counter(
            "aiwg_http_requests",
            "HTTP requests by surface and route template",
            ["surface", "method", "route", "status"],
            registry=r,
        )
        self.http_duration = Histogram(
            "aiwg_http_request_duration_seconds",
            "HTTP request latency by surface and route template",
            ["surface", "method", "route"],
            buckets=HTTP_BUCKETS,
            registry=r,
        )
        self.hostd_rpc_duration = Histogram(
            "aiwg_hostd_rpc_duration_seconds",
            "hostd RPC latency by method",
            ["method"],
            buckets=RPC_BUCKETS,
            registry=r,
        )
        self.hostd_rpc_errors = Counter(
            "aiwg_hostd_rpc_errors", "hostd RPC failures by method and error class", ["method", "error"], registry=r
        )
        self.hostd_up = Gauge("aiwg_hostd_up", "1 while the controller is connected to hostd", registry=r)
        self.instances = Gauge("aiwg_instances", "Instances in the catalog by state", ["state"], registry=r)
        self.open_sessions = Gauge("aiwg_open_sessions", "Running PTY sessions on hostd", registry=r)
        self.v1_requests = Counter(
            "aiwg_v1_path_requests", "Requests to deprecated /api/v1 paths by route template", ["path"], registry=r
        )
        self.idempotency_hits = Counter(
            "aiwg_idempotency_hit", "idempotency/v1 replays of a cached response", ["operation"], registry=r
        )
        self.idempotency_misses = Counter(
            "aiwg_idempotency_miss", "idempotency/v1 requests executed and cached", ["operation"], registry=r
        )
        self.idempotency_collisions = Counter(
            "aiwg_idempotency_collision",
            "idempotency/v1 requests refused: a cached messageId with a different request",
            ["operation"],
            registry=r,
        )
        self.operations = Counter(
            "aiwg_operations", "Operations that ended, by kind and state", ["kind", "state"], registry=r
        )
        self.tasks_pruned = Counter(
            "aiwg_tasks_pruned",
            "Ended A2A tasks pruned by the retention: past its age, or past the count kept per instance",
            ["reason"],
            registry=r,
        )
        self.instance_sleeps = Counter(
            "aiwg_instance_sleeps", "Instances put to sleep, by runtime and how", ["runtime", "how"], registry=r
        )
        self.instance_wakes = Counter(
            "aiwg_instance_wakes", "Instances woken, by runtime and cause", ["runtime", "cause"], registry=r
        )
        self.wake_duration = Histogram(
            "aiwg_instance_wake_seconds",
            "How long hostd took to wake an instance, by runtime",
            ["runtime"],
            buckets=WAKE_BUCKETS,
            registry=r,
        )
        self._v1_counts: dict[str, int] = {}
        for state in INSTANCE_STATES:
            self.instances.labels(state=state).set(0)

    def observe_http(self, surface: str, method: str, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(surface=surface, method=method, route=route, status=str(status)).inc()
        self.http_duration.labels(surface=surface, method=method, route=route).observe(seconds)

    def observe_hostd(self, method: str, seconds: float, error: str | None) -> None:
        self.hostd_rpc_duration.labels(method=method).observe(seconds)
        if error is not None:
            self.hostd_rpc_errors.labels(method=method, error=error).inc()

    def count_v1(self, path: str) -> None:
        self.v1_requests.labels(path=path).inc()
        self._v1_counts[path] = self._v1_counts.get(path, 0) + 1

    def v1_counts(self) -> dict[str, int]:
        """Hits per v1 route template since the process started."""
        return dict(self._v1_counts)

    def count_sleeps(self, runtime: str, how: str | None, n: int) -> None:
        self.instance_sleeps.labels(runtime=runtime, how=how or "unknown").inc(n)

    def count_wakes(self, runtime: str, wake: m.WakeDetail | None, n: int) -> None:
        self.instance_wakes.labels(runtime=runtime, cause=wake.cause if wake else "unknown").inc(n)
        if wake is not None:
            self.wake_duration.labels(runtime=runtime).observe(wake.took_s)

    def set_instances(self, counts: dict[str, int]) -> None:
        for state in set(INSTANCE_STATES) | set(counts):
            self.instances.labels(state=state).set(counts.get(state, 0))

    def set_warm_pools(self, pools: Sequence[m.PoolInfo]) -> None:
        self._warm_pools.pools = tuple(pools)

    def render(self) -> bytes:
        return generate_latest(self.registry)
