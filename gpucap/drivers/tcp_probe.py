"""A node's hypervisor probed by TCP (docs/drivers.md, "The hypervisor probe"), for fleets where
the driver's own probe does not say whether the machine is up: bare metal, where a hung or
powered-off server's own port (its sshd, its node agent) stops accepting connections while
whatever manages it from outside would still answer.

Every driver's settings take these (``ProbeSettings``): with ``probe_tcp_port`` set, the
driver's ``hypervisor_answers(node)`` connects to ``probe_address`` (a template on ``{node}``,
the node's hostname by default) on that port, and a connection accepted within
``probe_timeout_seconds`` is an answer; nothing is sent or read. Unset (0), the driver asks as
it always does (libvirt its version, the simulated fleet its Redis).
"""

import socket
import threading
from dataclasses import dataclass, field

from gpucap.drivers.base import template_check

PORT_MAX = 65535


def _port_problem(port: int) -> str:
    if 0 <= port <= PORT_MAX:
        return ""
    return f"must be a TCP port (1 to {PORT_MAX}), or 0 to ask the driver, got {port!r}"


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """The hypervisor probe's settings, part of each driver's settings (they inherit these)."""

    # How long the hypervisor watch waits for a node to answer its probe.
    probe_timeout_seconds: float = field(default=10.0, metadata={"minimum": 0.1})
    # 0: the driver's own probe; else the TCP port a node accepts connections on when it is up.
    probe_tcp_port: int = field(default=0, metadata={"check": _port_problem})
    probe_address: str = field(
        default="{node}", metadata={"check": template_check(allowed={"node"})}
    )

    def probe_by_tcp(self) -> bool:
        return self.probe_tcp_port != 0

    def probe_answers(self, node: str) -> bool:
        """Whether ``node`` accepts a connection on the probe's port within the timeout."""
        address = self.probe_address.format(node=node)
        return port_answers(address, self.probe_tcp_port, timeout=self.probe_timeout_seconds)


def port_answers(address: str, port: int, *, timeout: float) -> bool:
    """Whether ``address`` accepts a TCP connection on ``port`` within ``timeout`` seconds, the
    name's lookup included (the resolver keeps its own time, so the connection is made in a
    thread of its own). A probe still waiting then is no answer; its thread ends on its own,
    at most ``timeout`` after its lookup. Never raises."""
    done = threading.Event()
    answered: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((address, port), timeout=timeout):
                answered.append(True)
        except (OSError, UnicodeError):  # refused, unreachable, timed out, or no such name
            pass
        finally:
            done.set()

    threading.Thread(target=probe, name=f"tcp probe {address}:{port}", daemon=True).start()
    return done.wait(timeout) and bool(answered)
