"""Redfish servers for the BMC tests, all on loopback ports of their own.

- ``StaticBmc``: sushy-tools' static emulator (``sushy-static``) serving a mockup directory, a
  tree of ``index.json`` files as DMTF's mockups are laid out. It answers every GET from the
  files and has no authentication (any user name and password are let in).
- ``DynamicBmc``: sushy-tools' dynamic emulator (``sushy-emulator``) with its fake systems
  driver and its htpasswd Basic auth on: a real BMC's 401 for a wrong password.
- ``LibvirtBmc``: the same emulator with its libvirt driver over the real-guest rig's libvirtd
  (tests/realguest/rig.py): the rig's QEMU guests are the servers; resets and virtual media
  change the domains for real.
- ``PlainHttp``: a web server that is not a BMC: an HTML page for every path, or 404s.
- ``RefusingBmc``: the service root for anyone, then 401 with a Basic challenge for every other
  request, as a BMC answers a wrong user name or password.

Each is a context manager: started and answering on entry, stopped on exit.
"""

import contextlib
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import bcrypt

MOCKUPS = Path(__file__).resolve().parent / "mockups"
GPU_SERVER = MOCKUPS / "gpu-server"


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def mockup_copy(destination: Path, source: Path = GPU_SERVER) -> Path:
    """A copy of a mockup that a test may change (a swapped card, a GPU gone bad)."""
    shutil.copytree(source, destination)
    return destination


class StaticBmc:
    """``sushy-static`` on 127.0.0.1 serving ``mockup``; ``url`` is its address. With a
    ``certificate`` and its ``key``, over HTTPS."""

    def __init__(
        self, mockup: Path = GPU_SERVER, *, certificate: Path | None = None, key: Path | None = None
    ) -> None:
        self.mockup = mockup
        self.tls = ["--ssl-certificate", str(certificate), "--ssl-key", str(key)] if key else []
        self.url = ""
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> "StaticBmc":
        # The port is chosen before the emulator binds it: on the rare clash with another
        # process, the emulator exits and the next port is tried.
        for _ in range(5):
            port = free_port()
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sushy_tools.static.main",
                    "--interface",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--mockup-files",
                    str(self.mockup),
                    *self.tls,
                ],
                # It prints the headers of every request it serves.
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
            if _answers(f"{self.url}/redfish/v1/", self._process, timeout=30):
                return self
            self._stop()
        raise RuntimeError(f"sushy-static did not start serving {self.mockup}")

    def __exit__(self, *exc) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None


class _Emulator:
    """``sushy-emulator`` on 127.0.0.1 behind htpasswd Basic auth: ``username`` and ``password``
    are let in, anyone else gets 401 (the service root excepted, as Redfish allows). Its
    configuration, htpasswd file and state live in a directory of its own; ``backend`` is the
    command-line choice of its systems driver."""

    username = "admin"
    password = "emulator-password"

    def __init__(self) -> None:
        self.url = ""
        self._process: subprocess.Popen | None = None
        self._directory = tempfile.TemporaryDirectory(prefix="gpucap-bmc-")
        self.directory = Path(self._directory.name)

    def configuration(self) -> str:
        """Lines of the emulator's configuration beyond its auth file and state directory."""
        return ""

    def backend(self) -> list[str]:
        raise NotImplementedError

    def __enter__(self):
        directory = self.directory
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=4)).decode()
        (directory / "htpasswd").write_text(f"{self.username}:{hashed}\n")
        (directory / "state").mkdir()
        config = directory / "emulator.conf"
        config.write_text(
            f"SUSHY_EMULATOR_AUTH_FILE = {str(directory / 'htpasswd')!r}\n"
            f"SUSHY_EMULATOR_STATE_DIR = {str(directory / 'state')!r}\n" + self.configuration()
        )
        for _ in range(5):
            port = free_port()
            argv = [sys.executable, "-m", "sushy_tools.emulator.main", "--config", str(config)]
            with open(directory / "emulator.log", "ab") as log:
                self._process = subprocess.Popen(
                    [*argv, "--interface", "127.0.0.1", "--port", str(port), *self.backend()],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            self.url = f"http://127.0.0.1:{port}"
            if _answers(f"{self.url}/redfish/v1/", self._process, timeout=30):
                return self
            self._stop()
        raise RuntimeError(f"sushy-emulator did not start: {self.log()[-2000:]}")

    def log(self) -> str:
        """What the emulator printed (its requests and its errors)."""
        path = self.directory / "emulator.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __exit__(self, *exc) -> None:
        self._stop()
        self._directory.cleanup()

    def _stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None


class DynamicBmc(_Emulator):
    """``sushy-emulator`` with its fake systems driver: one fake system, ``h100-001``, whose
    power changes a few seconds after a reset."""

    def configuration(self) -> str:
        return (
            "SUSHY_EMULATOR_FAKE_SYSTEMS = [{'uuid': '27946b59-9e44-4fa7-8e91-f3527a1ef094', "
            "'name': 'h100-001', 'power_state': 'On', 'external_notifier': False, "
            "'nics': [{'mac': '00:5c:52:31:3a:9c', 'ip': '127.0.0.2'}]}]\n"
        )

    def backend(self) -> list[str]:
        return ["--fake"]


class LibvirtBmc(_Emulator):
    """``sushy-emulator`` with its libvirt driver over the libvirtd at ``uri`` (the real-guest
    rig's, tests/realguest/rig.py): a Redfish ComputerSystem per libvirt domain, whose id is the
    domain's UUID. A reset destroys and starts the domain for real; InsertMedia downloads the
    image, uploads it into the libvirt storage pool ``pool`` and attaches it to the domain as a
    read-only CD-ROM; a boot override rewrites the domain's boot order. ``only`` limits the
    systems it serves to those domains (UUIDs), as a BMC serves its own machine."""

    def __init__(self, uri: str, *, pool: str, only: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.uri = uri
        self.pool = pool
        self.only = only

    def configuration(self) -> str:
        lines = f"SUSHY_EMULATOR_STORAGE_POOL = {self.pool!r}\n"
        if self.only:
            lines += f"SUSHY_EMULATOR_ALLOWED_INSTANCES = {list(self.only)!r}\n"
        return lines

    def backend(self) -> list[str]:
        return ["--libvirt-uri", self.uri]


def _answers(url: str, process: subprocess.Popen, *, timeout: float) -> bool:
    """Poll ``url`` until it answers 200 (True) or the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    unverified = ssl._create_unverified_context()  # the tests' own self-signed certificate
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url, timeout=2, context=unverified) as answer,
        ):
            if answer.status == 200:
                return True
        time.sleep(0.05)
    return False


class _Server:
    """A threading HTTP server on a free loopback port with the given handler."""

    handler: type[BaseHTTPRequestHandler]

    def __enter__(self):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _HtmlPages(_Quiet):
    def do_GET(self) -> None:
        body = b"<!doctype html><title>Router admin</title><p>Welcome</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _NotFound(_Quiet):
    def do_GET(self) -> None:
        self.send_error(404)


class PlainHttp(_Server):
    """A web server that is not Redfish: ``html`` answers every GET with a page, else 404."""

    def __init__(self, *, html: bool = True) -> None:
        self.handler = _HtmlPages if html else _NotFound


class _Unauthorized(_Quiet):
    """The service root for anyone (Redfish lets it be read without credentials), 401 for
    everything else."""

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/redfish/v1":
            body = (GPU_SERVER / "index.json").read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._refuse()

    def _refuse(self) -> None:
        body = b'{"error": {"code": "Base.1.8.GeneralError", "message": "Unauthorized"}}'
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="BMC"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PATCH = _refuse


class RefusingBmc(_Server):
    """A BMC that refuses the user name and password: 401 for all but the service root."""

    handler = _Unauthorized


def url_answers(url: str) -> int:
    """The HTTP status a GET of ``url`` gets (for checking the servers themselves)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
