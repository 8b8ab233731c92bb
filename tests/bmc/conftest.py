"""The BMC tests' Redfish servers (tests/bmc/emulators.py).

``gpu_server_bmc`` is sushy-tools' static emulator serving the shipped mockup
(tests/bmc/mockups/gpu-server/): a ComputerSystem with two CPUs, 2 TiB of memory, two NICs and
eight H100 GPUs listed by SXM slot, whose PCIe functions put them on buses 18, 2a, 3a, 5d, 9a,
ab, ba and db; the GPU in slot SXM6 (bus ab, so the host's GPU 5) reports Health "Critical".
One emulator per test module: it starts in well under a second, and nothing changes it.
"""

import pytest

from tests.bmc.emulators import DynamicBmc, PlainHttp, RefusingBmc, StaticBmc

# A sealing key for the tests: pytest-django runs with DEBUG off, as production does, so the
# developer's key derived from SECRET_KEY is not used; a test that wants other keys sets them.
TEST_KEY = "dGVzdHMtb25seS1ibWMta2V5LTMyLWJ5dGVzLWxvbmc="


@pytest.fixture(autouse=True)
def bmc_keys(settings):
    settings.BMC_CREDENTIAL_KEYS = [TEST_KEY]


@pytest.fixture(scope="module")
def gpu_server_bmc():
    with StaticBmc() as bmc:
        yield bmc


@pytest.fixture(scope="module")
def refusing_bmc():
    with RefusingBmc() as bmc:
        yield bmc


@pytest.fixture(scope="module")
def web_page_server():
    with PlainHttp(html=True) as server:
        yield server


@pytest.fixture(scope="module")
def not_found_server():
    with PlainHttp(html=False) as server:
        yield server


@pytest.fixture(scope="module")
def dynamic_bmc():
    with DynamicBmc() as bmc:
        yield bmc


@pytest.fixture
def sent_tasks(monkeypatch) -> list[tuple[str, list]]:
    """Every task a service sends, as ``(name, args)``, instead of going to the broker; with
    ``django_capture_on_commit_callbacks(execute=True)`` it shows what is sent on commit."""
    from gpucap.celery import app

    sent: list[tuple[str, list]] = []
    monkeypatch.setattr(
        app, "send_task", lambda name, args=None, **options: sent.append((name, list(args or [])))
    )
    return sent
