"""Installer images for the virtual-media tests: a tiny ISO 9660 image built here (with
pycdlib, which the seed builder already uses) and a web server on a loopback port that serves a
directory of them, as an operator's image server would. It counts the requests it serves, so
a test can tell whether a BMC fetched an image."""

import functools
import io
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pycdlib


def tiny_iso(path: Path, *, label: str = "GPUCAPINST") -> Path:
    """An ISO 9660 image at ``path`` with one file, INSTALL.TXT, and volume label ``label``."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=label)
    text = b"gpucap installer image for the virtual-media tests\n"
    iso.add_fp(io.BytesIO(text), len(text), "/INSTALL.TXT;1")
    iso.write(str(path))
    iso.close()
    return path


class ImageServer:
    """``http.server`` serving ``directory`` on 127.0.0.1; ``url_of(name)`` is a file's URL and
    ``fetched`` the paths asked for so far."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.fetched: list[str] = []

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    def __enter__(self) -> "ImageServer":
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args) -> None:
                server.fetched.append(self.path)

        handler = functools.partial(Handler, directory=str(self.directory))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
