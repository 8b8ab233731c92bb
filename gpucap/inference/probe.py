"""The readiness prober: the router sends a replica requests only once its model server answers.

On a real VM, booted does not mean the model server is up (it may still be loading weights),
and a server can die while its VM runs on. So every ``INFERENCE_PROBE_SECONDS`` (beat,
``inference.probe``) each running replica with an endpoint is asked ``GET <endpoint_url><health
path>`` (``health_url``), all at once from a thread pool, each with a timeout of
``INFERENCE_PROBE_TIMEOUT_SECONDS``. A 2xx answer is a success; anything else (another status,
a refused or dropped connection, no answer in time) is a failure with its reason. One success
makes a replica ready; ``INFERENCE_PROBE_FAILURES`` failures in a row make it not ready
(`gpucap.inference.services.replica_probe_record`), and a change of readiness republishes the
deployment's route (gpucap/inference/cache.py), which lists ready replicas only.

A round reads each replica's last recorded probe before it probes, and its results count only
if nothing was recorded since: two rounds at once (two beat ticks overlapping) never count one
failure twice. The simulated driver's replicas go through the same probe: their model
simulator answers ``/v1/models`` (gpucap/drivers/model_simulator.py).
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import urllib3
from django.conf import settings
from django.utils import timezone

from gpucap.fleet.models import Image
from gpucap.inference import services
from gpucap.inference.models import replica_probe
from gpucap.rentals.models import VirtualMachine

MAX_THREADS = 32  # probes in flight at once in one round


@dataclass(frozen=True)
class Target:
    """One replica to probe, as the round read it."""

    vm_id: int
    instance_id: str
    endpoint_url: str
    url: str  # the health URL
    seen_at: datetime | None  # its last recorded probe when the round began


@dataclass(frozen=True)
class Outcome:
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class Round:
    """What one round did: replicas probed, probes that answered, probes that counted."""

    probed: int
    answered: int
    recorded: int

    def as_dict(self) -> dict[str, int]:
        return {"probed": self.probed, "answered": self.answered, "recorded": self.recorded}


def replicas_probe() -> Round:
    """One round: probe every running replica with an endpoint, then record what was found.
    Harmless to run twice at once or to miss once."""
    targets = round_targets()
    outcomes = health_checks(targets)
    recorded = outcomes_record(targets, outcomes)
    answered = sum(outcome.ok for outcome in outcomes)
    return Round(probed=len(targets), answered=answered, recorded=recorded)


def health_path(vm: VirtualMachine, image: Image | None = None) -> str:
    """The path a replica's model server answers its readiness probe on: its catalogue image's
    ``health_path``, else ``INFERENCE_PROBE_PATH`` (``/v1/models``, which every
    OpenAI-compatible server answers)."""
    path = image.health_path if image is not None and image.health_path else None
    path = path or settings.INFERENCE_PROBE_PATH
    return path if path.startswith("/") else f"/{path}"


def health_url(vm: VirtualMachine, image: Image | None = None) -> str:
    return f"{vm.endpoint_url.rstrip('/')}{health_path(vm, image)}"


def round_targets() -> list[Target]:
    """The replicas to probe now, each with its last recorded probe. One query."""
    replicas = (
        VirtualMachine.objects.filter(
            role=VirtualMachine.Role.INFERENCE_REPLICA,
            state=VirtualMachine.State.RUNNING,
            deployment__isnull=False,
        )
        .exclude(endpoint_url="")
        .select_related("probe", "pool")
        .order_by("pk")
    )
    images = {
        (image.cluster_id, image.name): image
        for image in Image.objects.filter(
            name__in={vm.image for vm in replicas},
            cluster_id__in={vm.pool.cluster_id for vm in replicas},
        )
    }
    targets = []
    for vm in replicas:
        probe = replica_probe(vm)
        targets.append(
            Target(
                vm_id=vm.pk,
                instance_id=vm.instance_id,
                endpoint_url=vm.endpoint_url,
                url=health_url(vm, images.get((vm.pool.cluster_id, vm.image))),
                seen_at=probe.last_probe_at if probe is not None else None,
            )
        )
    return targets


def health_checks(targets: list[Target]) -> list[Outcome]:
    """Probe every target at once (a thread each, up to MAX_THREADS); the outcomes in the
    targets' order. No database work here: the threads only speak HTTP."""
    if not targets:
        return []
    timeout = float(settings.INFERENCE_PROBE_TIMEOUT_SECONDS)
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(total=timeout), retries=False, maxsize=1, block=False
    )
    try:
        with ThreadPoolExecutor(
            max_workers=min(MAX_THREADS, len(targets)), thread_name_prefix="probe"
        ) as pool:
            return list(pool.map(lambda target: health_check(http, target.url), targets))
    finally:
        http.clear()


def health_check(http: urllib3.PoolManager, url: str) -> Outcome:
    """GET the health URL: a 2xx answer is a success; anything else a failure, with its
    reason in words an operator can act on."""
    timeout = settings.INFERENCE_PROBE_TIMEOUT_SECONDS
    try:
        response = http.request("GET", url, redirect=False, preload_content=False)
    except urllib3.exceptions.NewConnectionError as error:
        return Outcome(False, f"cannot connect to {url}: {_reason(error)}")
    except urllib3.exceptions.TimeoutError:
        return Outcome(False, f"no answer from {url} within {timeout} s")
    except urllib3.exceptions.ProtocolError:
        return Outcome(False, f"{url} closed the connection without an answer")
    except (urllib3.exceptions.HTTPError, ValueError) as error:
        return Outcome(False, f"{url}: {error}")
    try:
        if 200 <= response.status < 300:
            return Outcome(True)
        return Outcome(False, f"{url} answered HTTP {response.status}")
    finally:
        response.close()


def _reason(error: urllib3.exceptions.NewConnectionError) -> str:
    """``[Errno 111] Connection refused`` -> ``connection refused``."""
    cause = error.__cause__ or error.__context__
    text = getattr(cause, "strerror", None) or str(cause or error)
    return text[:1].lower() + text[1:]


def outcomes_record(targets: list[Target], outcomes: list[Outcome]) -> int:
    """Record each outcome (a transaction each, so a replica's row lock is held only while its
    own result is written). Returns how many counted."""
    at = timezone.now()
    recorded = 0
    for target, outcome in zip(targets, outcomes, strict=True):
        if services.replica_probe_record(
            vm_id=target.vm_id,
            endpoint_url=target.endpoint_url,
            seen_at=target.seen_at,
            ok=outcome.ok,
            error=outcome.error,
            at=at,
        ):
            recorded += 1
    return recorded
