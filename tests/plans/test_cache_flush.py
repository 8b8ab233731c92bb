"""Cache publishes are collected per transaction and flushed once on commit
(gpucap/cache_flush.py): an Approve with many victims writes the metadata cache in one round
trip, and a metadata cache that is down never fails the Approve."""

import json
import logging
import os

import pytest
import redis
from django.db import transaction

from gpucap.cache_flush import publish_on_commit
from gpucap.fleet import services as fleet
from gpucap.inference import cache as inference_cache
from gpucap.notices import cache
from gpucap.notices.models import InterruptionNotice
from gpucap.plans import services
from gpucap.plans.models import Plan, PlanAction
from gpucap.rentals.models import VirtualMachine
from tests.rentals.vm_helpers import request_vm, running_vm

State = VirtualMachine.State


@pytest.fixture
def metadata_keys(monkeypatch):
    """Metadata keys of this pytest process only, removed before and after."""
    prefix = f"gpucap:imds:flush{os.getpid()}:ip:"
    monkeypatch.setattr(cache, "KEY_PREFIX", prefix)
    client = cache.metadata_redis()

    def clear():
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)

    clear()
    yield client
    clear()


@pytest.fixture
def crowded_set(fleet_east, tenant, other_tenant):
    """h100-east grown to three 8-GPU nodes, all 24 GPUs held by 1-GPU spot VMs of acme, and
    globex asking for 8 + 8 + 4 on-demand GPUs: a plan with 20 victims."""
    h100 = fleet_east["sets"]["h100-east"]
    node = fleet.node_create(
        cluster=fleet_east["cluster"],
        hostname="h100-003",
        gpu_model="H100-SXM5-80GB",
        fabric="nvswitch",
        gpu_count=8,
    )
    fleet.node_join_set(node=node, capacity_set=h100)
    pools = fleet_east["pools"]
    fleet.pool_set_tenants(pool=pools["h100-ondemand"], tenants=[other_tenant])
    n = 0
    for hostname in ("h100-001", "h100-002", "h100-003"):
        for gpu in range(8):
            n += 1
            running_vm(
                tenant,
                pools["h100-spot"],
                node if hostname == "h100-003" else fleet_east["nodes"][hostname],
                [gpu],
                name=f"spot-{n}",
                ip=f"10.61.0.{n}",
            )
    for name, gpus in (("train-1", 8), ("train-2", 8), ("train-3", 4)):
        request_vm(other_tenant, pools["h100-ondemand"], name=name, gpu_count=gpus)
    h100.refresh_from_db()
    return h100


def count_calls(monkeypatch, module, name: str) -> list:
    """Every call of ``module.name`` (which still runs), as its argument."""
    calls = []
    original = getattr(module, name)

    def counted(ids):
        calls.append(set(ids))
        return original(ids)

    monkeypatch.setattr(module, name, counted)
    return calls


def count_pipelines(monkeypatch, client: redis.Redis) -> list:
    """Every pipeline ``client`` executes, as the number of commands in it."""
    executed = []
    make_pipeline = client.pipeline

    def pipeline(*args, **kwargs):
        pipe = make_pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted_execute(*a, **kw):
            executed.append(len(pipe.command_stack))
            return execute(*a, **kw)

        pipe.execute = counted_execute
        return pipe

    monkeypatch.setattr(client, "pipeline", pipeline)
    return executed


def test_an_approve_with_20_victims_flushes_the_metadata_cache_once_on_commit(
    crowded_set,
    operator,
    metadata_keys,
    monkeypatch,
    sent_plan_tasks,
    django_capture_on_commit_callbacks,
):
    plan = services.capacity_set_tick(capacity_set_id=crowded_set.pk).plan
    assert plan.preemptions == 20
    metadata_flushes = count_calls(monkeypatch, cache, "metadata_publish_many")
    route_flushes = count_calls(monkeypatch, inference_cache, "route_publish_many")
    pipelines = count_pipelines(monkeypatch, metadata_keys)

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        services.plan_approve(plan=plan, actor=operator)
        assert metadata_flushes == [], "nothing is published before the commit"

    victims = set(
        plan.actions.filter(kind=PlanAction.Kind.PREEMPTION).values_list("vm_id", flat=True)
    )
    assert len(victims) == 20
    assert metadata_flushes == [victims], "one flush, naming every victim once"
    assert pipelines == [20], "one Redis round trip with one write per victim"
    assert route_flushes == [], "no inference replica moved"
    assert sum(getattr(c, "__name__", "") == "flush" for c in callbacks) == 1
    victim = VirtualMachine.objects.filter(pk__in=victims).first()
    document = json.loads(metadata_keys.get(cache.metadata_key(victim.ip_address)))
    assert document["vm"] == victim.instance_id and document["notice"]["reason"] == "arbiter"


def test_an_approve_is_not_failed_by_a_metadata_cache_that_is_down(
    h100,
    full_set,
    on_demand_request,
    operator,
    settings,
    sent_plan_tasks,
    django_capture_on_commit_callbacks,
    caplog,
):
    on_demand_request()
    plan = services.capacity_set_tick(capacity_set_id=h100.pk).plan
    settings.METADATA_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing answers there

    with caplog.at_level(logging.ERROR), django_capture_on_commit_callbacks(execute=True):
        services.plan_approve(plan=plan, actor=operator)

    plan.refresh_from_db()
    assert plan.status == Plan.Status.APPLIED
    notices = InterruptionNotice.objects.filter(plan=plan)
    assert notices.count() == plan.preemptions == 2
    assert all(n.vm.state == State.NOTIFIED for n in notices)
    assert any("metadata cache flush failed" in record.getMessage() for record in caplog.records), (
        "the outage is logged"
    )


def test_ids_of_a_rolled_back_transaction_are_dropped(db, django_capture_on_commit_callbacks):
    flushed = []

    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            publish_on_commit("test-cache", 1, flushed.append)
            raise RuntimeError("roll back")
        with transaction.atomic():
            publish_on_commit("test-cache", 2, flushed.append)
            publish_on_commit("test-cache", 3, flushed.append)

    assert flushed == [{2, 3}]
