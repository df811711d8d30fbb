"""A manager's metrics for Prometheus and OpenTelemetry: its counters (``LockStats``)
and histograms of how long acquires waited and holds lasted.

Series are labelled with the table and the database engine only, never the key: a
process may touch millions of keys, and a series each would swamp the metrics store.
Managers with the same table and engine add up to one series. ``prometheus_client``
and ``opentelemetry`` are imported only here, when asked for (``tierlock[prometheus]``,
``tierlock[otel]``), so ``import tierlock`` needs neither.
"""

from __future__ import annotations

import abc
import bisect
import functools
import itertools
import os
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from . import __version__
from .manager import LockManager
from .stats import Observer
from .urls import engine_label

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Histogram, MeterProvider, Observation
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "BUCKETS",
    "COUNTERS",
    "OpenTelemetryMetrics",
    "PrometheusCollector",
    "instrument_opentelemetry",
    "register_prometheus",
]

#: Upper bounds in seconds of the wait and hold histograms' buckets: from a hold passed
#: in memory (well under a millisecond) through a database round trip to a minute.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: Every ``LockStats`` counter, exported as ``tierlock_<name>_total``, and its help.
COUNTERS = {
    "acquisitions": "Successful acquires, reentrant ones included.",
    "reentrant_acquisitions": "Acquires by a thread that already held the key.",
    "local_waits": "Acquires that queued behind another thread of the process.",
    "statements": "SQL statements sent on the lock table.",
    "shared_statements": "SQL statements that carried several threads' acquires or releases.",
    "contention_retries": "SQL statements sent again after a deadlock, a lock wait or a busy file.",
    "doorbell_queries": "MariaDB/MySQL named-lock queries that wake pollers.",
    "wakeups": "SQLite: pollers of other processes woken after a row left.",
    "inserts": "Lock rows inserted: holds won in the database.",
    "insert_conflicts": "Inserts that found the key held elsewhere.",
    "takeovers": "Expired rows of other holders replaced.",
    "local_handoffs": "Holds passed to a waiting thread of the process with no statement.",
    "handoffs": "Holds passed to a waiting thread of the process with one statement.",
    "reclaims": "Rows of holder processes proven gone, taken over before their lease ended.",
    "releases": "Successful releases, reentrant ones included.",
    "heartbeats": "Renewal statements sent.",
    "renewals": "Holds renewed (one renewal statement renews many).",
    "failed_renewals": "Renewals that could not reach the database (tried again soon).",
    "heartbeat_errors": "Heartbeats that failed unexpectedly (logged; the next one runs).",
    "lost_holds": "Holds found lost: their lease ended before a renewal, release or extend.",
    "reaped": "Expired rows deleted by reap() and the reaper.",
}
WAIT = "tierlock_wait_seconds", "Seconds from an acquire's call to its success."
HOLD = "tierlock_hold_seconds", "Seconds from a thread's outermost acquire to its last release."
LABELS = ("table", "engine")

Labels = tuple[str, str]  # the values of LABELS


class _Exported(abc.ABC):
    """The managers exported to one registry or meter provider."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._members: dict[LockManager, tuple[Labels, Observer]] = {}

    def add(self, locks: LockManager) -> None:
        """Export ``locks`` too (once, however often it is added)."""
        labels = (locks.table, engine_label(locks.url))
        with self._mutex:
            if locks in self._members:
                return
            observer = self._observer(labels)
            self._members[locks] = labels, observer
        locks._counters.observe(observer)

    @abc.abstractmethod
    def _observer(self, labels: Labels) -> Observer:
        """What times the acquires and holds of managers with these label values."""

    def _detach(self) -> None:
        """Stop timing the managers' acquires and holds, and exporting them."""
        with self._mutex:
            members, self._members = self._members, {}
        for locks, (_, observer) in members.items():
            locks._counters.unobserve(observer)

    def counts(self) -> dict[Labels, dict[str, int]]:
        """The managers' counters, summed by label values."""
        with self._mutex:
            members = [(locks, labels) for locks, (labels, _) in self._members.items()]
        totals: dict[Labels, dict[str, int]] = {}
        for locks, labels in members:
            stats = locks.stats()
            total = totals.setdefault(labels, dict.fromkeys(COUNTERS, 0))
            for name in COUNTERS:
                total[name] += getattr(stats, name)
        return totals


# -- Prometheus ----------------------------------------------------------------------


class _Histogram:
    """One series' bucket counts and sum."""

    def __init__(self) -> None:
        self.reset()
        _histograms.add(self)

    def reset(self) -> None:
        self._mutex = threading.Lock()
        self._counts = [0] * (len(BUCKETS) + 1)  # the last one: over the largest bound
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        index = bisect.bisect_left(BUCKETS, seconds)  # (a bound counts what equals it)
        with self._mutex:
            self._counts[index] += 1
            self._sum += seconds

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """The buckets as Prometheus reads them, ``le`` bounds with running totals, and
        the sum."""
        with self._mutex:
            counts, total = list(self._counts), self._sum
        bounds = [*(repr(float(bound)) for bound in BUCKETS), "+Inf"]
        return list(zip(bounds, itertools.accumulate(counts), strict=True)), total


# Counts restart in a forked child, as its managers' counters do.
_histograms: weakref.WeakSet[_Histogram] = weakref.WeakSet()


def _reset_in_child() -> None:
    for histogram in list(_histograms):
        histogram.reset()


os.register_at_fork(after_in_child=_reset_in_child)


class _Timer:
    """Observes for the wait and hold histograms of one label set."""

    def __init__(self) -> None:
        self.wait = _Histogram()
        self.hold = _Histogram()

    def waited(self, seconds: float) -> None:
        self.wait.observe(seconds)

    def held(self, seconds: float) -> None:
        self.hold.observe(seconds)


class PrometheusCollector(_Exported):
    """The ``prometheus_client`` collector of the managers registered on one registry;
    ``close()`` unregisters it and stops timing their acquires and holds."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self._registry = weakref.ref(registry)
        self._timers: dict[Labels, _Timer] = {}

    def _observer(self, labels: Labels) -> Observer:
        return self._timers.setdefault(labels, _Timer())

    def describe(self) -> list[Metric]:
        """The families, without samples: the registry refuses names already taken."""
        return self._families({}, {})

    def collect(self) -> list[Metric]:
        counts = self.counts()
        with self._mutex:
            timers = dict(self._timers)
        return self._families(counts, timers)

    def close(self) -> None:
        registry = self._registry()
        if registry is not None:
            with _registered:
                if _collectors.get(registry) is self:
                    del _collectors[registry]
                    registry.unregister(self)
        self._detach()
        with self._mutex:
            self._timers = {}

    @staticmethod
    def _families(
        counts: dict[Labels, dict[str, int]], timers: dict[Labels, _Timer]
    ) -> list[Metric]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        families: list[Metric] = []
        for name, text in COUNTERS.items():
            counter = CounterMetricFamily(f"tierlock_{name}", text, labels=LABELS)
            for labels, total in counts.items():
                counter.add_metric(labels, total[name])
            families.append(counter)
        for (name, text), side in ((WAIT, "wait"), (HOLD, "hold")):
            histogram = HistogramMetricFamily(name, text, labels=LABELS, unit="seconds")
            for labels, timer in timers.items():
                buckets, total = getattr(timer, side).cumulative()
                histogram.add_metric(labels, buckets, total)
            families.append(histogram)
        return families


_registered = threading.Lock()
_collectors: weakref.WeakKeyDictionary[CollectorRegistry, PrometheusCollector] = (
    weakref.WeakKeyDictionary()
)


def register_prometheus(
    locks: LockManager, registry: CollectorRegistry | None = None
) -> PrometheusCollector:
    """Export ``locks``'s counters and wait and hold histograms on ``registry``
    (default: ``prometheus_client``'s global one) as ``tierlock_*``.

    All the managers registered on one registry share its one collector, which this
    returns: ``collector.close()`` unregisters it and stops timing their acquires and
    holds (use it rather than ``registry.unregister``, which would leave the timing on
    and the next ``register_prometheus`` on that registry adding to the unregistered
    collector).
    """
    from prometheus_client import REGISTRY

    registry = REGISTRY if registry is None else registry
    with _registered:
        collector = _collectors.get(registry)
        if collector is None:
            collector = PrometheusCollector(registry)
            registry.register(collector)
            _collectors[registry] = collector
    collector.add(locks)
    return collector


# -- OpenTelemetry -------------------------------------------------------------------


def _attributes(labels: Labels) -> dict[str, str]:
    table, engine = labels
    return {"table": table, "engine": engine}


class _Recorder:
    """Records one label set's waits and holds in the OpenTelemetry histograms."""

    def __init__(self, wait: Histogram, hold: Histogram, labels: Labels) -> None:
        self._wait = wait
        self._hold = hold
        self._attributes = _attributes(labels)

    def waited(self, seconds: float) -> None:
        self._wait.record(seconds, self._attributes)

    def held(self, seconds: float) -> None:
        self._hold.record(seconds, self._attributes)


class OpenTelemetryMetrics(_Exported):
    """The ``tierlock`` meter's instruments on one meter provider, for the managers
    instrumented on it; ``close()`` stops exporting and timing them."""

    def __init__(self, provider: MeterProvider) -> None:
        super().__init__()
        meter = provider.get_meter("tierlock", __version__)
        for name, text in COUNTERS.items():
            callback = functools.partial(self._observe, name)
            meter.create_observable_counter(f"tierlock_{name}", [callback], description=text)
        self._wait, self._hold = (
            meter.create_histogram(
                name, unit="s", description=text, explicit_bucket_boundaries_advisory=BUCKETS
            )
            for name, text in (WAIT, HOLD)
        )

    def _observer(self, labels: Labels) -> Observer:
        return _Recorder(self._wait, self._hold, labels)

    def _observe(self, name: str, options: CallbackOptions) -> Iterator[Observation]:
        from opentelemetry.metrics import Observation

        for labels, total in self.counts().items():
            yield Observation(total[name], _attributes(labels))

    def close(self) -> None:
        self._detach()


# An instrument's name can be created once per meter: a second one would be ignored.
_instrumented: weakref.WeakKeyDictionary[MeterProvider, OpenTelemetryMetrics] = (
    weakref.WeakKeyDictionary()
)


def instrument_opentelemetry(
    locks: LockManager, meter_provider: MeterProvider | None = None
) -> OpenTelemetryMetrics:
    """Report ``locks``'s counters (observable counters) and waits and holds
    (histograms, in seconds) through the ``tierlock`` meter of ``meter_provider``
    (default: the global one), with the names that ``register_prometheus`` uses."""
    from opentelemetry.metrics import get_meter_provider

    provider = get_meter_provider() if meter_provider is None else meter_provider
    with _registered:
        instruments = _instrumented.get(provider)
        if instruments is None:
            instruments = _instrumented[provider] = OpenTelemetryMetrics(provider)
    instruments.add(locks)
    return instruments
