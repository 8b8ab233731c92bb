"""Metrics fixtures: the shared counters in a Redis database of the tests' own (from the
environment: ``TEST_METRICS_REDIS_URL``), emptied of
this test database's keys around each test; a scrape helper that parses what /metrics says
with prometheus_client's own parser; the rentals fixtures for VMs in any state."""

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from gpucap import metrics
from tests.conftest import TEST_METRICS_REDIS_URL
from tests.rentals.conftest import sent_tasks  # noqa: F401  (fixture)

METRICS_TEST_REDIS = TEST_METRICS_REDIS_URL
TOKEN = "metrics-test-token-0123456789abcdef"


@pytest.fixture(autouse=True)
def shared_counters(db):
    client = redis.Redis.from_url(METRICS_TEST_REDIS)
    previous, metrics.shared_counters_redis = metrics.shared_counters_redis, lambda: client

    def empty() -> None:
        keys = [metrics.shared_counter_key(counter) for counter in metrics.SHARED_COUNTERS]
        client.delete(*keys)

    empty()
    yield client
    empty()
    metrics.shared_counters_redis = previous


@pytest.fixture
def metrics_token(settings) -> str:
    settings.METRICS_TOKEN = TOKEN
    return TOKEN


class Scrape:
    """What one scrape of /metrics said: ``scrape.value("gpucap_gpus", set="x", state="held")``
    (a sample that is not there reads as None)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {family.name: family for family in text_string_to_metric_families(text)}
        self.samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in self.families.values()
            for sample in family.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def total(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        return sum(
            value
            for (sample, sample_labels), value in self.samples.items()
            if sample == name and labels.items() <= dict(sample_labels).items()
        )


@pytest.fixture
def scrape(client, metrics_token):
    """``scrape()``: GET /metrics with the bearer token and parse it."""

    def get() -> Scrape:
        response = client.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith("text/plain")
        return Scrape(response.content.decode())

    return get
