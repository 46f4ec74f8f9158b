"""`pigeon_site_recipients_total` has a bounded set of site labels, as the queue one has: a
site per recipient domain (each domain with no MX is one) would grow a scrape without end."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pigeon.metrics import MAX_SITE_LABELS, Metrics


def test_sites_past_the_cap_are_counted_as_other() -> None:
    metrics = Metrics()
    for n in range(MAX_SITE_LABELS + 500):
        metrics.counts.outcome("Delivery", "q", f"mx.domain{n}.test")
    metrics.counts.outcome("Delivery", "q", "mx.domain0.test")  # a site already known keeps its label
    metrics.counts.outcome("Bounce", "q", "mx.domain1.test")  # with any outcome
    metrics.counts.outcome("Bounce", "q", "mx.domain-new.test")  # a new site past the cap: _other
    (family,) = (
        f
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        if f.name == "pigeon_site_recipients"
    )
    values = {(s.labels["outcome"], s.labels["site"]): s.value for s in family.samples if s.name.endswith("_total")}
    assert len({site for _, site in values}) == MAX_SITE_LABELS + 1  # sites, not (outcome, site) pairs
    assert values[("Delivery", "_other")] == 500
    assert values[("Bounce", "_other")] == 1
    assert values[("Bounce", "mx.domain1.test")] == 1
    assert values[("Delivery", "mx.domain0.test")] == 2
    assert sum(values.values()) == MAX_SITE_LABELS + 503
