"""The test harness's Redfish servers themselves: the static emulator serves the shipped
mockup as DMTF lays mockups out, and stops with its fixture."""

import json
import urllib.request

from tests.bmc.emulators import GPU_SERVER, StaticBmc, url_answers


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.load(answer)


def test_the_static_emulator_serves_the_gpu_server_mockup(gpu_server_bmc):
    root = _get(f"{gpu_server_bmc.url}/redfish/v1/")
    processors = _get(f"{gpu_server_bmc.url}/redfish/v1/Systems/1/Processors")
    kinds = [
        _get(f"{gpu_server_bmc.url}{member['@odata.id']}")["ProcessorType"]
        for member in processors["Members"]
    ]

    assert root["RedfishVersion"] == "1.17.0"
    assert kinds == ["CPU"] * 2 + ["GPU"] * 8
    assert url_answers(f"{gpu_server_bmc.url}/redfish/v1/Systems/2") == 404


def test_every_link_of_the_mockup_leads_to_a_resource():
    """A mockup is a tree of index.json files; every @odata.id in it must be one of them."""
    served = {
        "/redfish/v1/" + str(path.parent.relative_to(GPU_SERVER)).removeprefix(".")
        for path in GPU_SERVER.rglob("index.json")
    }
    served = {path.rstrip("/") for path in served}
    links = set()
    for path in GPU_SERVER.rglob("index.json"):
        _links(json.loads(path.read_text()), links)

    assert {link.rstrip("/") for link in links} <= served


def _links(doc, found: set) -> None:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "@odata.id":  # actions' targets are POSTed to, not resources
                found.add(value)
            else:
                _links(value, found)
    elif isinstance(doc, list):
        for value in doc:
            _links(value, found)


def test_the_emulator_stops_with_its_fixture():
    with StaticBmc() as bmc:
        url = f"{bmc.url}/redfish/v1/"
        assert url_answers(url) == 200

    try:
        url_answers(url)
    except OSError as error:
        assert "refused" in str(error).lower()
    else:
        raise AssertionError("the emulator still answers after its fixture ended")


def test_the_refusing_bmc_shows_its_root_and_refuses_the_rest(refusing_bmc):
    assert url_answers(f"{refusing_bmc.url}/redfish/v1/") == 200
    assert url_answers(f"{refusing_bmc.url}/redfish/v1/Systems") == 401
