"""The gateway's plain-int metrics of the live path (gateway/metrics.py
`PlainHistogram`, `PlainCounter`) expose what prometheus_client's own would:
same names, cumulative `le` buckets (a value on a bound counts in it),
`_count`, `_sum`, `_total`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.metrics import GatewayMetrics, PlainCounter, PlainHistogram

_BUCKETS = (0.0005, 0.001, 0.002, 0.01, 1.0)
_VALUES = [0.0, 0.0005, 0.0007, 0.001, 0.0011, 0.002, 0.5, 1.0, 3.0, 0.0001]


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_plain_histogram_and_counter_expose_what_prometheus_client_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    h = PlainHistogram("x_seconds", "x", _BUCKETS, ours)
    c = PlainCounter("y", "y", ours)
    ref_h = Histogram("x_seconds", "x", buckets=_BUCKETS, registry=theirs)
    ref_c = Counter("y", "y", registry=theirs)
    for v in _VALUES:
        h.observe(v)
        ref_h.observe(v)
        c.inc(3)
        ref_c.inc(3)
    got = _samples(ours)
    assert got == _samples(theirs)
    assert (
        ours.get_sample_value("x_seconds_bucket", {"le": "0.001"}) == 5
    )  # 0, .0005, .0007, .001, .0001
    assert ours.get_sample_value("x_seconds_bucket", {"le": "+Inf"}) == len(_VALUES)
    assert ours.get_sample_value("y_total") == 3 * len(_VALUES)


def test_gateway_metrics_keep_their_names() -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    m.commit_to_send_seconds.observe(0.0025)
    m.events_fanned_out.inc(7)
    bucket = "runlog_gateway_commit_to_queue_seconds_bucket"
    assert registry.get_sample_value(bucket, {"le": "0.002"}) == 0
    assert registry.get_sample_value(bucket, {"le": "0.003"}) == 1
    assert registry.get_sample_value("runlog_gateway_commit_to_queue_seconds_count") == 1
    assert registry.get_sample_value("runlog_gateway_events_fanned_out_total") == 7
