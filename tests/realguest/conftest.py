"""The real-guest rig for the whole session (tests/realguest/rig.py): the tiny guest image, a node
namespace with libvirtd and the metadata proxy, and the deployed ASGI application (metadata
endpoint, router, Django) under uvicorn on the node's uplink, as a gpucap web server is."""

import socket
import threading

import pytest
import uvicorn
from django.conf import settings

from tests.realguest import bare_metal, rig


@pytest.fixture(scope="session")
def guest_image() -> rig.GuestImage:
    return rig.guest_image()


@pytest.fixture(scope="session")
def accel(guest_image, say) -> str:
    chosen = rig.accelerator(guest_image)
    say(f"real guests run under {'KVM' if chosen == 'kvm' else 'QEMU emulation (TCG)'}")
    return chosen


_SAID: list[str] = []


@pytest.fixture(scope="session")
def say():
    """Note what the rig found or measured; the run's summary prints it (pytest_terminal_summary
    below), where captured output would hide it."""
    return _SAID.append


def pytest_terminal_summary(terminalreporter):
    if _SAID:
        terminalreporter.section("real guests")
        for line in _SAID:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def node(django_db_setup, django_db_blocker):
    """A GPU node without GPUs, with its metadata proxy in front of gpucap's ASGI application.
    The endpoint trusts X-Forwarded-For from the node's uplink address only."""
    the_node = rig.Node()
    previous = settings.METADATA_TRUSTED_PROXIES
    settings.METADATA_TRUSTED_PROXIES = [rig.NODE_SIDE]
    server = thread = None
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((rig.HOST_SIDE, 0))
        from gpucap.asgi import application

        config = uvicorn.Config(
            application, proxy_headers=False, log_level="warning", lifespan="on"
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        with django_db_blocker.unblock():
            thread.start()
            rig.wait_until(lambda: server.started, timeout=30, what="uvicorn to start")
        the_node.endpoint = f"http://{rig.HOST_SIDE}:{sock.getsockname()[1]}"
        the_node.proxy(sock.getsockname()[1])
        yield the_node
    finally:
        if server is not None:
            server.should_exit = True
            thread.join(timeout=10)
        settings.METADATA_TRUSTED_PROXIES = previous
        the_node.close()


@pytest.fixture(scope="module")
def bare_metal_server(node, guest_image, accel, request):
    """A machine with a BMC, for real (tests/realguest/bare_metal.py): a running domain on the
    rig's libvirtd and ``LibvirtBmc`` (sushy-emulator's libvirt driver, htpasswd Basic auth on,
    on a free loopback port) serving it alone. One per test module, named after it."""
    name = "bm-" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace(
        "_", "-"
    )
    with bare_metal.server(node, guest_image, accel, name) as machine:
        yield machine
