"""Discovery through the API with REAL Celery workers (``celery worker`` subprocesses on this
test database and a queue of this run's own): the web request only stores the run; a worker
reads the emulated BMC and stores the preview; applying is read and applied by a worker too.
With two workers and the apply's message delivered twice, the node is created once."""

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.bmc.models import DiscoveryRun
from gpucap.celery import app
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from tests.bmc.conftest import TEST_KEY
from tests.rentals import conftest as rentals_fixtures
from tests.rentals.conftest import queue_in_flight, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

celery_queue = rentals_fixtures.celery_queue
workers = rentals_fixtures.workers

URL = "/api/bmc/discoveries/"


def state_of(run_id: int) -> str:
    return DiscoveryRun.objects.get(pk=run_id).state


def test_workers_read_preview_and_apply_once(workers, celery_queue, operator_api, gpu_server_bmc):
    fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)
    first = workers(BMC_CREDENTIAL_KEYS=TEST_KEY)
    second = workers(BMC_CREDENTIAL_KEYS=TEST_KEY)

    def logs() -> str:
        return first.log() + "\n--- second worker ---\n" + second.log()

    entry = {
        "cluster": "east",
        "address": gpu_server_bmc.url,
        "username": "admin",
        "password": "s3cret-bmc-password",
        "fabric": "nvswitch",
    }
    posted = operator_api.post(URL, {"entries": [entry]}, format="json")
    assert posted.status_code == 202
    run_id = posted.json()["id"]

    wait_for(lambda: state_of(run_id) == "previewed", timeout=60, what="the preview", log=logs)
    preview = operator_api.get(f"{URL}{run_id}/").json()
    assert preview["lines"][0].startswith("would create node east/h100-001: 8 x NVIDIA H100")
    assert not Node.objects.exists()

    assert operator_api.post(f"{URL}{run_id}/apply/").status_code == 202
    app.send_task("bmc.discover", args=[run_id])  # delivered twice: both workers take one

    wait_for(lambda: state_of(run_id) == "applied", timeout=60, what="the apply", log=logs)
    idle = lambda: not queue_in_flight(celery_queue)  # noqa: E731
    wait_for(idle, timeout=30, what="the second message", log=logs)
    assert Node.objects.get(hostname="h100-001").gpus.count() == 8
    assert AuditEvent.objects.filter(verb="node.create").count() == 1
    assert DiscoveryRun.objects.get(pk=run_id).passwords_sealed == []
