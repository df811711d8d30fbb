"""``tierlock.metrics``: a known workload on a real database, read back from the
Prometheus exposition and from OpenTelemetry's in-memory reader."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import procs
import pytest
from conftest import SERVERS, MakeManager
from engines import keeps_expired
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from polling import wait_until
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from proxy import Proxy

import tierlock
from tierlock.metrics import (
    BUCKETS,
    COUNTERS,
    instrument_opentelemetry,
    register_prometheus,
)

ENGINES = {
    "sqlite": "sqlite",
    "mariadb": "mysql",
    "postgresql": "postgresql",
    "redis": "redis",
    "zookeeper": "zookeeper",
    "file": "file",
}
HELD = 0.3  # a hold of known length, which a waiting thread sits out


def scrape(registry: CollectorRegistry, labels: dict[str, str]) -> dict[str, float]:
    """Every ``tierlock_*`` sample of the exposition, labelled ``labels``, by name (with
    ``:le`` for a bucket); any other label set fails the test."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        if not family.name.startswith("tierlock_"):
            continue
        for sample in family.samples:
            sample_labels = dict(sample.labels)
            le = sample_labels.pop("le", None)
            assert sample_labels == labels, sample
            values[sample.name if le is None else f"{sample.name}:{le}"] = sample.value
    return values


def read_otel(reader: InMemoryMetricReader, attributes: dict[str, str]) -> dict[str, object]:
    """The one data point of each ``tierlock`` instrument: a counter's value or a
    histogram's point; any other attribute set fails the test."""
    points: dict[str, object] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "tierlock"
            for metric in scope.metrics:
                (point,) = metric.data.data_points
                assert dict(point.attributes or {}) == attributes, metric.name
                points[metric.name] = (
                    point if isinstance(point, HistogramDataPoint) else point.value  # type: ignore[union-attr]
                )
    return points


def run_workload(manager: tierlock.LockManager, other: tierlock.LockManager, key: str) -> list[str]:
    """Acquire and release in known ways (counted in ``KNOWN``); return the keys used."""
    used: list[str] = []

    def lock(**options: float | bool) -> tierlock.Lock:
        used.append(f"{key}:{len(used)}")
        return manager.lock(used[-1], **options)  # type: ignore[arg-type]

    # Five holds, each with a reentrant acquire inside: ten acquisitions, five holds.
    plain = lock()
    for _ in range(5):
        with plain, plain:
            pass

    # Contention in tier 1: a thread queues behind the main one, and gets the key from
    # it once it has waited through a hold of known length: with one UPDATE, since the
    # row was last proved ours longer ago than passing.CONFIRMED_WITHIN.
    contended = lock()
    assert contended.acquire()
    got: list[bool] = []

    def wait_in_line() -> None:
        got.append(contended.acquire(timeout=procs.WAIT_LIMIT))
        contended.release()

    waiter = threading.Thread(target=wait_in_line)
    waiter.start()
    wait_until(lambda: manager.stats().local_waits == 1, "the thread to queue")
    time.sleep(HELD)
    contended.release()
    waiter.join(procs.WAIT_LIMIT)
    assert got == [True]

    # Contention between processes: a try without waiting meets another's row.
    busy = lock()
    with other.lock(used[-1]):
        assert not busy.acquire(blocking=False)

    # A hold deleted behind its holder's back, found gone by the next renewal.
    lost = lock(ttl=1.5)
    assert lost.acquire()
    assert other.force_release(used[-1])
    wait_until(lambda: manager.stats().lost_holds == 1, "a renewal to find the hold lost")
    with pytest.raises(tierlock.LockLostError):
        lost.release()

    # An expired fixed lease, reaped (on Redis, its key is gone with the lease).
    expired = lock(ttl=0.05, renew=False)
    assert expired.acquire()
    wait_until(lambda: not expired.locked(), "the lease to end")
    assert manager.reap() == KNOWN["reaped"] or manager.info(used[-1]) is None
    with pytest.raises(tierlock.LockLostError):
        expired.release()
    return used


KNOWN = {  # what run_workload does, counted
    "acquisitions": 10 + 2 + 1 + 1,
    "reentrant_acquisitions": 5,
    "releases": 10 + 2,
    "local_waits": 1,
    "local_handoffs": 0,
    "handoffs": 1,
    "insert_conflicts": 1,
    "lost_holds": 2,
    "reaped": 1,
}
HOLDS = 5 + 2 + 1 + 1  # outermost holds in run_workload, lost ones included


def test_a_known_workload_is_exported_to_prometheus_and_opentelemetry(
    make_manager: MakeManager, key: str, db: str, table: str
) -> None:
    manager, other = make_manager(), make_manager()
    registry = CollectorRegistry()
    register_prometheus(manager, registry)
    reader = InMemoryMetricReader()
    instrument_opentelemetry(manager, MeterProvider(metric_readers=[reader]))
    used = run_workload(manager, other, key)
    known = {**KNOWN, "reaped": KNOWN["reaped"] if keeps_expired(db) else 0}

    labels = {"table": table, "engine": ENGINES[db]}
    exported = scrape(registry, labels)
    stats = manager.stats()
    assert {name: getattr(stats, name) for name in known} == known
    assert {name: exported[f"tierlock_{name}_total"] for name in COUNTERS} == {
        name: getattr(stats, name) for name in COUNTERS
    }
    # Every successful acquire is timed, and every outermost hold (lost ones too).
    assert exported["tierlock_wait_seconds_count"] == stats.acquisitions
    assert exported["tierlock_hold_seconds_count"] == HOLDS
    for side in ("wait", "hold"):
        count = exported[f"tierlock_{side}_seconds_count"]
        assert exported[f"tierlock_{side}_seconds_bucket:+Inf"] == count
        assert exported[f"tierlock_{side}_seconds_sum"] >= HELD  # the waiter's, the holder's
        assert exported[f"tierlock_{side}_seconds_bucket:0.25"] <= count - 1
    assert all(used_key.startswith(key) for used_key in used)
    assert key not in generate_latest(registry).decode()

    points = read_otel(reader, labels)
    assert {name: points[f"tierlock_{name}"] for name in COUNTERS} == {
        name: getattr(stats, name) for name in COUNTERS
    }
    for side in ("wait", "hold"):
        point = points[f"tierlock_{side}_seconds"]
        assert isinstance(point, HistogramDataPoint)
        assert tuple(point.explicit_bounds) == BUCKETS
        prefix = f"tierlock_{side}_seconds"
        assert point.count == exported[f"{prefix}_count"]
        assert point.sum == pytest.approx(exported[f"{prefix}_sum"])
        cumulative = [sum(point.bucket_counts[: i + 1]) for i in range(len(BUCKETS))]
        assert cumulative == [exported[f"{prefix}_bucket:{float(b)!r}"] for b in BUCKETS]


def test_managers_of_one_table_and_engine_add_up_to_one_series(
    make_manager: MakeManager, key: str, db: str, table: str
) -> None:
    first, second = make_manager(), make_manager()
    collector = register_prometheus(first)  # on the global registry, as an application would
    try:
        assert register_prometheus(second) is collector  # (a second collector would clash)
        assert register_prometheus(first) is collector  # counted once however often
        for manager, holds in ((first, 2), (second, 3)):
            for _ in range(holds):
                with manager.lock(key):
                    pass
        exported = scrape(REGISTRY, {"table": table, "engine": ENGINES[db]})
        assert exported["tierlock_acquisitions_total"] == 5
        assert exported["tierlock_wait_seconds_count"] == 5
        assert exported["tierlock_hold_seconds_count"] == 5
    finally:
        collector.close()
    assert "tierlock_" not in generate_latest(REGISTRY).decode()
    assert first._counters.observers == second._counters.observers == ()  # nothing timed
    registry = CollectorRegistry()
    assert register_prometheus(first, registry) is not collector
    with first.lock(key):
        pass
    exported = scrape(registry, {"table": table, "engine": ENGINES[db]})
    assert exported["tierlock_acquisitions_total"] == 3  # the manager's own counters
    assert exported["tierlock_wait_seconds_count"] == 1  # timed since registered


def test_opentelemetry_stops_at_close(manager: tierlock.LockManager, key: str, db: str) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instruments = instrument_opentelemetry(manager, provider)
    assert instrument_opentelemetry(manager, provider) is instruments
    with manager.lock(key), manager.lock(key):
        pass
    points = read_otel(reader, {"table": manager.table, "engine": ENGINES[db]})
    assert points["tierlock_acquisitions"] == 2
    wait = points["tierlock_wait_seconds"]
    hold = points["tierlock_hold_seconds"]
    assert isinstance(wait, HistogramDataPoint) and isinstance(hold, HistogramDataPoint)
    assert (wait.count, hold.count) == (2, 1)  # the reentrant acquire waits, holds nothing more
    instruments.close()
    assert manager._counters.observers == ()
    with manager.lock(key):
        pass
    points = read_otel(reader, {"table": manager.table, "engine": ENGINES[db]})
    assert "tierlock_acquisitions" not in points
    wait = points["tierlock_wait_seconds"]
    assert isinstance(wait, HistogramDataPoint) and wait.count == 2


def test_import_tierlock_imports_no_metrics_library() -> None:
    code = (
        "import sys, tierlock, tierlock.metrics; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('prometheus_client', 'opentelemetry')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


@SERVERS
@pytest.mark.slow
def test_failed_renewals_are_exported(
    proxied: MakeManager, proxy: Proxy, key: str, db: str, table: str
) -> None:
    locks = proxied(ttl=3.0, database_timeout=0.5)
    registry = CollectorRegistry()
    register_prometheus(locks, registry)
    lock = locks.lock(key)
    assert lock.acquire()
    proxy.refuse_all()
    wait_until(lambda: locks.stats().failed_renewals, "a renewal to fail")
    proxy.accept_new()
    wait_until(lambda: locks.stats().renewals, "a renewal once the database is back")
    lock.release()
    exported = scrape(registry, {"table": table, "engine": ENGINES[db]})
    stats = locks.stats()
    assert exported["tierlock_failed_renewals_total"] == stats.failed_renewals >= 1
    assert exported["tierlock_lost_holds_total"] == stats.lost_holds == 0


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_forked_child_counts_from_zero(manager: tierlock.LockManager, key: str) -> None:
    """The child's counters restart, as its manager's do, histograms included."""
    registry = CollectorRegistry()
    register_prometheus(manager, registry)
    with manager.lock(key):
        pass
    labels = {"table": manager.table, "engine": "sqlite"}
    procs.wait_for_ended_threads()
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            counts = scrape(registry, labels)
            code = int(
                counts["tierlock_acquisitions_total"] + counts["tierlock_wait_seconds_count"]
            )
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert scrape(registry, labels)["tierlock_wait_seconds_count"] == 1
