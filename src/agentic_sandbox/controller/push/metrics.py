"""Push delivery metrics, in the app's registry (see :mod:`controller.metrics`).

* ``aiwg_push_deliveries_total{instance}``: events a receiver answered 2xx.
* ``aiwg_push_failures_total{instance}``: events given up on (retry budget spent, or dropped from
  a full queue).
* ``aiwg_push_retries_total{instance}``: attempts after a failed one.
* ``aiwg_push_queue_depth{instance}``: events stored but not yet delivered, over the instance's configs.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class PushMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["instance"]
        self.deliveries = Counter("aiwg_push_deliveries", "Push events delivered", labels, registry=registry)
        self.failures = Counter("aiwg_push_failures", "Push events given up on", labels, registry=registry)
        self.retries = Counter(
            "aiwg_push_retries", "Push delivery attempts after a failed one", labels, registry=registry
        )
        self.queue_depth = Gauge("aiwg_push_queue_depth", "Push events not yet delivered", labels, registry=registry)
