"""The Redfish client against real servers: sushy-tools' static emulator serving the shipped
GPU-server mockup, over HTTP and HTTPS, and servers that are not a working BMC (a wrong password,
nothing listening, one that never answers, a plain web server). No database."""

import socket
import subprocess
from pathlib import Path

import pytest

from gpucap.bmc import redfish
from gpucap.bmc.inventory import FAILED, OK
from gpucap.bmc.redfish import BmcError, BmcTarget, inventory_read
from tests.bmc.emulators import StaticBmc, free_port

PCI_ORDER = [f"0000:{bus}:00.0" for bus in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]


def _target(url: str, **kwargs) -> BmcTarget:
    return BmcTarget(
        name="node h100-001", address=url, username="admin", password="s3cret", **kwargs
    )


def _refusal(target: BmcTarget) -> BmcError:
    with pytest.raises(BmcError) as caught:
        inventory_read(target)
    return caught.value


def test_the_gpu_server_is_read_whole(gpu_server_bmc):
    machine = inventory_read(_target(gpu_server_bmc.url))

    assert (machine.manufacturer, machine.model, machine.serial_number) == (
        "Contoso",
        "GS-8H100",
        "S8H1000421",
    )
    assert machine.host_name == "h100-001"
    assert machine.power_state == "on"
    assert [(cpu.model, cpu.cores, cpu.threads) for cpu in machine.cpus] == [
        ("Intel(R) Xeon(R) Platinum 8480+", 56, 112)
    ] * 2
    assert machine.memory_gib == 2048
    assert [(nic.mac_address, nic.speed_mbps, nic.link_up) for nic in machine.nics] == [
        ("3c:ec:ef:10:20:01", 1000, True),
        ("b8:3f:d2:aa:01:02", 400000, True),
    ]
    assert len(machine.gpus) == 8
    assert {gpu.model for gpu in machine.gpus} == {"NVIDIA H100 80GB HBM3"}


def test_gpus_are_numbered_in_pci_order_as_the_host_numbers_them(gpu_server_bmc):
    """The BMC lists them by SXM slot; nvidia-smi numbers them by PCI bus."""
    gpus = inventory_read(_target(gpu_server_bmc.url)).gpus

    assert [gpu.index for gpu in gpus] == list(range(8))
    assert [gpu.pci_address for gpu in gpus] == PCI_ORDER
    assert [gpu.slot for gpu in gpus] == [2, 4, 3, 1, 8, 6, 7, 5]
    first = gpus[0]
    assert first.redfish_id == "GPU_SXM_2"
    assert first.uuid == "GPU-7a1c5e02-9b2d-4c3e-8f40-000000000018"
    assert first.serial_number == "1654923000102"
    assert len({gpu.uuid for gpu in gpus}) == 8


def test_the_gpu_the_bmc_calls_critical_is_failed(gpu_server_bmc):
    machine = inventory_read(_target(gpu_server_bmc.url))

    assert [gpu.index for gpu in machine.failed_gpus] == [5]
    failed = machine.gpus[5]
    assert (failed.health, failed.bmc_health, failed.slot) == (FAILED, "Critical", 6)
    assert {gpu.health for gpu in machine.gpus if gpu.index != 5} == {OK}


def test_wrong_credentials_are_named_as_such(refusing_bmc):
    error = _refusal(_target(refusing_bmc.url))

    assert error.kind == redfish.CREDENTIALS
    assert error.message == (
        f"node h100-001: the BMC at {refusing_bmc.url} refused the user name or password (HTTP 401)"
    )
    assert not error.transient


def test_a_wrong_password_is_refused_by_a_real_redfish_emulator(dynamic_bmc):
    """sushy-emulator with Basic auth: the right password reads its system, a wrong one is a
    401, named as such."""
    right = BmcTarget(
        name="node h100-001",
        address=dynamic_bmc.url,
        username=dynamic_bmc.username,
        password=dynamic_bmc.password,
    )
    assert inventory_read(right).uuid == "27946b59-9e44-4fa7-8e91-f3527a1ef094"

    error = _refusal(_target(dynamic_bmc.url))

    assert error.kind == redfish.CREDENTIALS
    assert error.message == (
        f"node h100-001: the BMC at {dynamic_bmc.url} refused the user name or password (HTTP 401)"
    )


def test_nothing_listening_is_unreachable_and_worth_retrying():
    url = f"http://127.0.0.1:{free_port()}"

    error = _refusal(_target(url))

    assert error.kind == redfish.UNREACHABLE
    assert error.message == f"node h100-001: no answer from the BMC at {url} (connection refused)"
    assert error.transient


def test_a_bmc_that_never_answers_times_out():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections complete in the backlog; nothing ever reads them
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"

        error = _refusal(_target(url, read_timeout=0.5))

    assert error.kind == redfish.UNREACHABLE
    assert error.message.endswith("(no answer within 0.5 s)")


def test_a_web_page_is_not_redfish(web_page_server):
    error = _refusal(_target(web_page_server.url))

    assert error.kind == redfish.NOT_REDFISH
    assert error.message == (
        f"node h100-001: {web_page_server.url} answers HTTP but is not a Redfish service "
        "(GET /redfish/v1/ is not JSON)"
    )
    assert not error.transient


def test_a_web_server_without_redfish_is_not_redfish(not_found_server):
    error = _refusal(_target(not_found_server.url))

    assert error.kind == redfish.NOT_REDFISH
    assert error.message.endswith("(GET /redfish/v1/ gave HTTP 404)")


def test_an_address_without_scheme_means_https():
    assert _target("10.0.0.5").url == "https://10.0.0.5"
    assert _target("bmc-001.example:8443/").url == "https://bmc-001.example:8443"
    assert _target("http://127.0.0.1:8000").url == "http://127.0.0.1:8000"


def test_the_password_never_shows_in_the_target():
    assert "s3cret" not in repr(_target("10.0.0.5"))


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    certificate, key = directory / "bmc.crt", directory / "bmc.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(certificate)),
        ],
        check=True,
        capture_output=True,
    )
    return certificate, key


@pytest.fixture(scope="module")
def tls_bmc(self_signed):
    certificate, key = self_signed
    with StaticBmc(certificate=certificate, key=key) as bmc:
        yield bmc


def test_an_unverifiable_certificate_is_refused_by_default(tls_bmc):
    error = _refusal(_target(tls_bmc.url))

    assert error.kind == redfish.TLS
    assert error.message.startswith(f"node h100-001: the BMC at {tls_bmc.url}: its TLS certificate")
    assert "turn TLS verification off for this BMC" in error.message


def test_the_explicit_opt_out_reads_a_bmc_with_a_self_signed_certificate(tls_bmc):
    machine = inventory_read(_target(tls_bmc.url, verify_tls=False))

    assert len(machine.gpus) == 8
