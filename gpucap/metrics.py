"""Prometheus metrics that gpucap's processes count as they serve requests.

Counts of things in the database (GPUs, notices, plans) are read when /metrics is scraped; what
is defined here is what only the serving process sees: requests and their latencies.
"""

from prometheus_client import Counter, Histogram

# Latencies of requests answered in-process: sub-millisecond to a slow upstream.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

ROUTER_REQUESTS = Counter(
    "gpucap_router_requests",
    "Requests the inference router answered, by deployment and HTTP status.",
    ["deployment", "code"],
)
ROUTER_LATENCY = Histogram(
    "gpucap_router_request_duration_seconds",
    "Time from a request reaching the inference router to the last byte of its answer.",
    ["deployment"],
    buckets=LATENCY_BUCKETS,
)
METADATA_REQUESTS = Counter(
    "gpucap_metadata_requests",
    "Requests the instance metadata endpoint answered, by flavour (ec2, gcp, azure) and status.",
    ["flavour", "code"],
)
METADATA_LATENCY = Histogram(
    "gpucap_metadata_request_duration_seconds",
    "Time the instance metadata endpoint took to answer.",
    ["flavour"],
    buckets=LATENCY_BUCKETS,
)
