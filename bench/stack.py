"""The processes the end-to-end benches run on loopback, each in a process group of its own so
that stopping it stops its children too (uvicorn's workers, Celery's pool): the web server as
the Procfile serves it, and Celery workers and beat."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_start(port: int, env: dict[str, str], *, workers: int) -> subprocess.Popen:
    """``gpucap.asgi:application`` under uvicorn as the Procfile serves it (--no-proxy-headers),
    without access logs; returns once ``/healthz`` answers."""
    command = [
        str(VENV_BIN / "uvicorn"),
        "gpucap.asgi:application",
        *("--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)),
        *("--no-proxy-headers", "--no-access-log", "--log-level", "warning"),
    ]
    server = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.read() == b"ok":
                    return server
        except OSError:
            time.sleep(0.2)
    process_stop(server)
    raise SystemExit("uvicorn did not start")


def celery_start(
    env: dict[str, str], log: Path, *, beat: bool = False, concurrency: int = 2
) -> subprocess.Popen:
    """A Celery worker (or beat, its schedule file next to ``log``) as ``make run`` starts
    them, writing to ``log``. Returns at once: a worker's tasks wait in the queue until it is
    up."""
    if beat:
        role = ["beat", "--schedule", str(log.with_suffix(".schedule"))]
    else:
        role = ["worker", "--concurrency", str(concurrency), "--hostname", f"{log.stem}@%h"]
    command = [str(VENV_BIN / "celery"), "-A", "gpucap.celery", *role, "--loglevel", "WARNING"]
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def process_stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process's group, SIGKILL after 10 s; harmless if it has exited."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
