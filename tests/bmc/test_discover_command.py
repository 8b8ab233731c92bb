"""``manage.py bmc_discover``: a YAML list of BMCs, passwords from the environment."""

import io

import pytest
from django.core.management import CommandError, call_command

from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node


@pytest.fixture
def east(db):
    return fleet.cluster_create(name="east", driver=Cluster.Driver.SIMULATED)


def _run(*args) -> str:
    out = io.StringIO()
    call_command("bmc_discover", *args, stdout=out)
    return out.getvalue()


def _file(tmp_path, url: str, **extra) -> str:
    lines = [
        "- cluster: east",
        f"  address: {url}",
        "  username: admin",
        "  password_env: BMC_H100_001",
        "  fabric: nvswitch",
        "  gpu_model: H100-SXM5-80GB",
        *[f"  {key}: {value}" for key, value in extra.items()],
    ]
    path = tmp_path / "bmcs.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_dry_run_then_apply_then_nothing_left(east, gpu_server_bmc, tmp_path, monkeypatch):
    monkeypatch.setenv("BMC_H100_001", "s3cret")
    path = _file(tmp_path, gpu_server_bmc.url)

    preview = _run(path, "--dry-run")
    assert preview.startswith("would create node east/h100-001: 8 x H100-SXM5-80GB nvswitch")
    assert not Node.objects.exists()

    assert _run(path).endswith("created 1 node, unchanged 0\n")
    assert _run(path) == "nothing to change, unchanged 1\n"


def test_problems_of_the_file_are_named_and_nothing_is_read(east, tmp_path, monkeypatch):
    monkeypatch.delenv("BMC_H100_001", raising=False)
    path = _file(tmp_path, "https://127.0.0.1:9", fabric_manager="yes")

    with pytest.raises(CommandError) as caught:
        _run(path)

    assert str(caught.value).splitlines() == [
        f"{path}: entries[0]: fabric_manager: extra inputs are not permitted",
    ]


def test_a_password_variable_that_is_not_set_is_named(east, tmp_path, monkeypatch):
    monkeypatch.delenv("BMC_H100_001", raising=False)
    path = _file(tmp_path, "https://127.0.0.1:9")

    with pytest.raises(CommandError) as caught:
        _run(path)

    assert str(caught.value) == f"{path}: entries[0]: password_env: BMC_H100_001 is not set"
