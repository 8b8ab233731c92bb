"""Discovery through the API (docs/bmc.md): an operator posts a list of BMCs, a worker reads
them (``bmc.discover``, carried out here as the worker would) and stores the preview; applying
reads them again and applies only what was previewed. The emulated GPU server becomes a node,
a second run changes nothing, a BMC that changed since the preview gets the run refused with
the fresh preview, and a BMC that refuses, does not answer or is not Redfish is a problem
naming it, with nothing changed."""

import json

import pytest

from gpucap.audit.models import AuditEvent
from gpucap.bmc.discovery_runs import Outcome, discovery_carry_out
from gpucap.bmc.models import BmcCredential, DiscoveryRun
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from tests.bmc.emulators import DynamicBmc, StaticBmc, free_port, mockup_copy

URL = "/api/bmc/discoveries/"
PASSWORD = "s3cret-bmc-password"


@pytest.fixture
def east(db):
    return fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)


def entry(address: str, **fields) -> dict:
    return {
        "cluster": "east",
        "address": address,
        "username": "admin",
        "password": PASSWORD,
        "fabric": "nvswitch",
        "gpu_model": "H100-SXM5-80GB",
        **fields,
    }


@pytest.fixture
def ask(operator_api, django_capture_on_commit_callbacks, sent_tasks):
    """``ask("post", path, body)``: the operator's request, its on-commit tasks recorded."""

    def request(method: str, path: str, body: dict | None = None):
        with django_capture_on_commit_callbacks(execute=True):
            return getattr(operator_api, method)(path, body, format="json")

    return request


def work(sent_tasks) -> list[Outcome]:
    """What a worker does with the ``bmc.discover`` tasks sent so far."""
    outcomes = []
    while sent_tasks:
        name, args = sent_tasks.pop(0)
        assert name == "bmc.discover"
        outcomes.append(discovery_carry_out(run_id=args[0]))
    return outcomes


def preview(ask, sent_tasks, *entries: dict) -> dict:
    posted = ask("post", URL, {"entries": list(entries)})
    assert posted.status_code == 202, posted.json()
    work(sent_tasks)
    return ask("get", f"{URL}{posted.json()['id']}/").json()


def apply(ask, sent_tasks, run: dict) -> dict:
    asked = ask("post", f"{URL}{run['id']}/apply/")
    assert asked.status_code == 202, asked.json()
    assert asked.json()["state"] == "applying"
    work(sent_tasks)
    return ask("get", f"{URL}{run['id']}/").json()


def test_the_bmcs_are_read_by_a_worker_and_previewed(east, gpu_server_bmc, ask, sent_tasks):
    posted = ask("post", URL, {"entries": [entry(gpu_server_bmc.url)]})

    assert posted.status_code == 202
    run = posted.json()
    assert (run["state"], run["lines"], run["requested_by"]) == ("reading", [], "olivia")
    assert run["message"] == "reading 1 BMC; poll this run until it is previewed"
    assert sent_tasks == [("bmc.discover", [run["id"]])]  # read by a worker, not the request

    assert work(sent_tasks) == [Outcome.PREVIEWED]
    run = ask("get", f"{URL}{run['id']}/").json()
    assert run["state"] == "previewed"
    assert run["lines"] == [
        "would create node east/h100-001: 8 x H100-SXM5-80GB nvswitch, standalone, failed GPU 5 "
        f"(BMC: Critical), BMC {gpu_server_bmc.url}, Contoso GS-8H100 serial S8H1000421"
    ]
    assert run["summary"] == "dry run, nothing written: would create 1 node, unchanged 0"
    assert len(run["digest"]) == 64
    assert run["message"] == f"preview ready: POST {URL}{run['id']}/apply/ to apply it"
    assert not Node.objects.exists()


def test_the_password_is_never_shown_nor_stored_in_clear(east, gpu_server_bmc, ask, sent_tasks):
    run = preview(ask, sent_tasks, entry(gpu_server_bmc.url))

    assert PASSWORD not in json.dumps(run)
    assert "password" not in run["entries"][0]
    stored = DiscoveryRun.objects.get(pk=run["id"])
    assert PASSWORD not in json.dumps(stored.entries)
    assert len(stored.passwords_sealed) == 1 and PASSWORD not in stored.passwords_sealed[0]

    applied = apply(ask, sent_tasks, run)

    assert applied["state"] == "applied"
    # Once the run is over, not even the sealed password is kept.
    assert DiscoveryRun.objects.get(pk=run["id"]).passwords_sealed == []
    assert PASSWORD not in json.dumps(list(AuditEvent.objects.values("before", "after")))


def test_apply_makes_the_node_and_a_second_run_changes_nothing(
    east, gpu_server_bmc, ask, sent_tasks
):
    run = preview(ask, sent_tasks, entry(gpu_server_bmc.url))

    applied = apply(ask, sent_tasks, run)

    assert applied["state"] == "applied"
    assert applied["applied_by"] == "olivia"
    assert applied["lines"] == [line.removeprefix("would ") for line in run["lines"]]
    assert applied["summary"] == applied["message"] == "created 1 node, unchanged 0"
    node = Node.objects.get(cluster=east, hostname="h100-001")
    assert [gpu.health for gpu in node.gpus.order_by("index")] == ["ok"] * 5 + ["failed"] + [
        "ok"
    ] * 2
    assert BmcCredential.objects.get(node=node).username == "admin"
    events = AuditEvent.objects.count()

    again = preview(ask, sent_tasks, entry(gpu_server_bmc.url))
    assert (again["lines"], again["summary"]) == (
        [],
        "dry run, nothing written: nothing to change, unchanged 1",
    )
    assert again["message"] == "nothing to change"
    assert apply(ask, sent_tasks, again)["state"] == "applied"
    assert AuditEvent.objects.count() == events


def _edit(mockup, processor: str, **fields) -> None:
    path = mockup / "Systems" / "1" / "Processors" / processor / "index.json"
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


def test_a_bmc_that_changed_since_the_preview_gets_it_refused_with_the_fresh_one(
    east, ask, sent_tasks, tmp_path
):
    mockup = mockup_copy(tmp_path / "gpu-server")
    with StaticBmc(mockup) as bmc:
        apply(ask, sent_tasks, preview(ask, sent_tasks, entry(bmc.url)))
        _edit(mockup, "GPU_SXM_6", Status={"State": "Enabled", "Health": "OK"})
        seen = preview(ask, sent_tasks, entry(bmc.url))
        assert seen["lines"] == [
            "would update node east/h100-001: GPU 5 health failed -> ok (BMC: OK); inventory "
            "changed"
        ]
        # Before the operator applies it, the card in SXM3 (the host's GPU 2) fails.
        _edit(mockup, "GPU_SXM_3", Status={"State": "Enabled", "Health": "Critical"})

        refused = apply(ask, sent_tasks, seen)

        assert refused["state"] == "refused"
        fresh = refused["fresh_run"]
        assert fresh["state"] == "previewed"
        assert fresh["lines"] == [
            "would update node east/h100-001: GPU 2 health ok -> failed (BMC: Critical); GPU 5 "
            "health failed -> ok (BMC: OK); inventory changed"
        ]
        assert fresh["digest"] != seen["digest"]
        assert refused["message"] == (
            f"discovery {seen['id']} was refused: the BMCs said something else when it was "
            "applied than its preview showed, and nothing was applied; review the fresh "
            f"preview, run {fresh['id']}, and apply that one"
        )
        node = Node.objects.get(hostname="h100-001")
        assert [g.health for g in node.gpus.order_by("index")][2:6] == ["ok", "ok", "ok", "failed"]

        again = ask("post", f"{URL}{seen['id']}/apply/")
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "stale_preview"
        assert again.json()["fresh_run"]["id"] == fresh["id"]

        assert apply(ask, sent_tasks, fresh)["state"] == "applied"
    assert [g.health for g in node.gpus.order_by("index")][2:6] == ["failed", "ok", "ok", "ok"]


def _problems_and_nothing_changed(run: dict, problems: list[str]) -> None:
    assert run["state"] == "failed"
    assert run["problems"] == problems
    assert (
        run["message"]
        == f"{len(problems)} problem{'s' if len(problems) > 1 else ''}, nothing applied"
    )
    assert not Node.objects.exists()
    assert DiscoveryRun.objects.get(pk=run["id"]).passwords_sealed == []


def test_wrong_credentials_are_a_problem_naming_the_node(east, ask, sent_tasks):
    with DynamicBmc() as bmc:
        run = preview(ask, sent_tasks, entry(bmc.url, hostname="h100-009", username=bmc.username))

    _problems_and_nothing_changed(
        run, [f"node h100-009: the BMC at {bmc.url} refused the user name or password (HTTP 401)"]
    )


def test_an_unreachable_bmc_fails_the_whole_run(east, gpu_server_bmc, ask, sent_tasks):
    dead = f"http://127.0.0.1:{free_port()}"

    run = preview(ask, sent_tasks, entry(gpu_server_bmc.url), entry(dead, hostname="h100-002"))

    _problems_and_nothing_changed(
        run, [f"node h100-002: no answer from the BMC at {dead} (connection refused)"]
    )


def test_a_bmc_that_is_not_redfish_is_named_by_its_address(east, web_page_server, ask, sent_tasks):
    run = preview(ask, sent_tasks, entry(web_page_server.url))

    _problems_and_nothing_changed(
        run,
        [
            f"entries[0]: {web_page_server.url} answers HTTP but is not a Redfish service "
            "(GET /redfish/v1/ is not JSON)"
        ],
    )
    assert ask("post", f"{URL}{run['id']}/apply/").json()["error"]["code"] == "failed"


def test_a_bmc_gone_between_preview_and_apply_fails_the_apply(east, ask, sent_tasks):
    with StaticBmc() as bmc:
        run = preview(ask, sent_tasks, entry(bmc.url))

    failed = apply(ask, sent_tasks, run)

    assert failed["state"] == "failed"
    # Named by its address: the entry gave no host name, and this time the BMC said none.
    assert failed["problems"] == [
        f"entries[0]: no answer from the BMC at {bmc.url} (connection refused)"
    ]
    assert not Node.objects.exists()


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (
            {"entries": [{"address": "10.0.0.5", "username": "a", "password": "p"}]},
            {"entries[0].cluster": ["This field is required."]},
        ),
        (
            {"entries": [entry("10.0.0.5", cluster="west")]},
            {"entries[0].cluster": ["no cluster named west"]},
        ),
        (
            {"entries": [entry("10.0.0.5", fabric="infiniband")]},
            {"entries[0].fabric": ["'infiniband' is not one of: pcie, nvswitch"]},
        ),
        ({"entries": [entry("   ")]}, {"entries[0].address": ["This field may not be blank."]}),
        (
            {"entries": [entry("ftp://10.0.0.5")]},
            {"entries[0].address": ["speaks ftp://; a BMC is reached over https:// (or http://)"]},
        ),
        (
            {"entries": [entry("10.0.0.5", password_env="BMC_1")]},
            {"entries[0].password_env": ["cannot be set by this request"]},
        ),
        (
            {"entries": [entry("10.0.0.5", verify_tls="no")]},
            {"entries[0].verify_tls": ['must be true or false, not "no"']},
        ),
        (
            {"entries": [entry("10.0.0.5", hostname="H100_001")]},
            {
                "entries[0].hostname": [
                    "'H100_001' must be a DNS hostname: labels of letters, digits and hyphens "
                    "(1 to 63 each, no hyphen at either end) joined by dots"
                ]
            },
        ),
        ({"entries": []}, {"entries": ["list at least one BMC"]}),
        (
            [entry("10.0.0.5")],
            {"non_field_errors": ['send the list as an object: {"entries": [...]}']},
        ),
        (
            {"entries": [entry("10.0.0.5")], "dry_run": True},
            {"dry_run": ["cannot be set by this request"]},
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(
    east, ask, sent_tasks, body, fields
):
    answer = ask("post", URL, body)

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid"
    if fields is not None:
        assert error["fields"] == fields
    assert not DiscoveryRun.objects.exists()
    assert sent_tasks == []


def test_a_run_is_applied_once(east, gpu_server_bmc, ask, sent_tasks):
    posted = ask("post", URL, {"entries": [entry(gpu_server_bmc.url)]}).json()
    early = ask("post", f"{URL}{posted['id']}/apply/")
    assert (early.status_code, early.json()["error"]["code"]) == (409, "not_ready")
    work(sent_tasks)

    assert ask("post", f"{URL}{posted['id']}/apply/").status_code == 202
    twice = ask("post", f"{URL}{posted['id']}/apply/")
    assert (twice.status_code, twice.json()["error"]["code"]) == (409, "applying")
    sent = list(sent_tasks)
    assert work(sent_tasks) == [Outcome.APPLIED]
    # The same message delivered again (a worker lost after applying) does nothing.
    assert [discovery_carry_out(run_id=args[0]) for _, args in sent] == [Outcome.NOTHING]
    after = ask("post", f"{URL}{posted['id']}/apply/")
    assert (after.status_code, after.json()["error"]["code"]) == (409, "applied_already")
    assert Node.objects.count() == 1


def test_only_operators_discover(east, member_api, anonymous_api, sent_tasks):
    body = {"entries": [entry("10.0.0.5")]}
    assert member_api.post(URL, body, format="json").status_code == 403
    assert anonymous_api.post(URL, body, format="json").status_code == 401
    assert member_api.get(URL).status_code == 403
    assert not DiscoveryRun.objects.exists()


def test_the_list_runs_a_fixed_number_of_queries(
    east, gpu_server_bmc, ask, sent_tasks, operator_api, django_assert_num_queries
):
    preview(ask, sent_tasks, entry(gpu_server_bmc.url))
    with django_assert_num_queries(2):
        first = operator_api.get(URL)
    for _ in range(3):
        preview(ask, sent_tasks, entry(gpu_server_bmc.url))
    with django_assert_num_queries(2):
        answer = operator_api.get(URL)
    assert first.json()["count"] == 1
    assert [run["state"] for run in answer.json()["results"]] == ["previewed"] * 4
