"""The fluid queue of one step, worked by hand."""

import pytest

from gpucap.simulation.queue import queue_step, replicas_wanted

ONE_REPLICA = {"ready": 1, "replica_concurrency": 8, "service_seconds": 1.0, "queue_limit": 64}


def test_load_within_capacity_leaves_no_queue_and_signals_littles_law():
    step = queue_step(queue_before=0, rate=6, seconds=60, wait_threshold_seconds=1, **ONE_REPLICA)
    assert (step.queue_after, step.refused, step.over_threshold) == (0, 0, 0)
    assert step.wait_p99_seconds == 0 and step.signal == 6


def test_load_over_capacity_fills_the_queue_then_refuses():
    step = queue_step(queue_before=0, rate=10, seconds=60, wait_threshold_seconds=4, **ONE_REPLICA)
    # 2/s more than the 8/s served: 120 would wait, the limit is 64, 56 are refused.
    assert (step.queue_after, step.refused) == (64, 56)
    # Waits spread from 0 to 64/8 = 8 s; half of that range lies over the 4 s threshold.
    assert step.wait_p99_seconds == pytest.approx(7.92)
    assert step.over_threshold == pytest.approx((600 - 56) / 2)
    assert step.signal == 8 + 64


def test_with_no_replica_ready_the_wait_is_unbounded():
    step = queue_step(
        queue_before=0, rate=1, seconds=60, wait_threshold_seconds=1, **{**ONE_REPLICA, "ready": 0}
    )
    assert step.wait_p99_seconds is None and step.queue_after == 60 and step.over_threshold == 60
    idle = queue_step(
        queue_before=0, rate=0, seconds=60, wait_threshold_seconds=1, **{**ONE_REPLICA, "ready": 0}
    )
    assert idle.wait_p99_seconds == 0


def test_the_autoscalers_rule_keeps_within_the_range_in_force():
    assert replicas_wanted(12, 4, 1, 4) == 3
    assert replicas_wanted(12.0000001, 4, 1, 4) == 3  # the router counts whole requests
    assert replicas_wanted(100, 4, 1, 4) == 4
    assert replicas_wanted(0, 4, 2, 4) == 2
