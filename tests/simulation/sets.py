"""A small set whose simulated outcome can be worked out by hand.

Three 8-GPU NVSwitch nodes, full: n1 holds the chat deployment's one replica (GPUs 0-3) and an
on-demand VM (4-7); n2 and n3 hold four 4-GPU spot VMs, started 10 minutes apart, so the two
most recently started are spot-3 and spot-4 (both on n3). Chat's replicas take 4 GPUs, its
replicas carry 16 requests at once and the autoscaler aims at 4 in flight per replica, each
request takes a second: 4 requests/s want one replica, 12 want three.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpucap.arbiter.model import CapacitySet, Deployment, Node, Pool, Snapshot, Vm
from gpucap.simulation import Curve, DeploymentLoad, DeploymentSpec, Profile

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)  # a Wednesday


def minute(count: float) -> datetime:
    return T0 + timedelta(minutes=count)


def running(vm_id: str, pool: str, node: str, gpus: tuple[int, ...], started: int, **extra) -> Vm:
    return Vm(id=vm_id, pool=pool, node=node, gpus=gpus, started_at=minute(started), **extra)


def full_set(*, spot_floor: int = 0, protect_seconds: int = 0) -> Snapshot:
    return Snapshot(
        capacity_set=CapacitySet(name="hand", fabric="nvswitch", gpu_model="H100"),
        nodes=(Node("n1", 8), Node("n2", 8), Node("n3", 8)),
        pools=(
            Pool("chat", "inference", 1),
            Pool("rent", "on_demand", 2),
            Pool("spot", "spot", 3, spot_floor, protect_seconds),
        ),
        vms=(
            running("chat-1", "chat", "n1", (0, 1, 2, 3), -600, deployment="chat", tenant="acme"),
            running("rent-1", "rent", "n1", (4, 5, 6, 7), -500, tenant="acme"),
            running("spot-1", "spot", "n2", (0, 1, 2, 3), -40, tenant="globex"),
            running("spot-2", "spot", "n2", (4, 5, 6, 7), -30, tenant="globex"),
            running("spot-3", "spot", "n3", (0, 1, 2, 3), -20, tenant="initech"),
            running("spot-4", "spot", "n3", (4, 5, 6, 7), -10, tenant="initech"),
        ),
        deployments=(Deployment("chat", "chat", 1),),
        now=T0,
    )


CHAT = DeploymentSpec(
    pool="chat",
    gpus_per_replica=4,
    min_replicas=1,
    max_replicas=4,
    target_in_flight=4,
    replica_concurrency=16,
    queue_limit=64,
    scale_down_cooldown_seconds=600,
    tenant="acme",
)


def chat_load(*points: tuple[float, float]) -> Profile:
    """Chat's requests per second as a step curve (points in minutes), one second each."""
    curve = Curve(tuple((at * 60.0, rate) for at, rate in points), "step")
    return Profile(deployments={"chat": DeploymentLoad(requests=curve, service_seconds=1.0)})
