"""What an ASGI app keeps per event loop (its Redis clients, its connections), and the lifespan
that closes all of it at shutdown.

A server process runs one event loop; tests start several, and a client must not outlive the
loop its connections belong to. Every ``PerLoop`` joins one registry, so the one lifespan the
deployed application answers (gpucap/asgi.py, through the metadata front) closes every app's
clients of its loop before it says the shutdown is complete.
"""

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Closable(Protocol):
    async def aclose(self) -> None: ...


T = TypeVar("T", bound=Closable)

_holders: "list[PerLoop]" = []


class PerLoop(Generic[T]):
    """One ``T`` per event loop, made by ``make`` on first use there."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )
        # The last (loop, value) asked for: a server process has one loop, so this is the
        # answer on the hot path, without a weak dictionary's lookup.
        self._last: tuple = (None, None)
        _holders.append(self)

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        last = self._last
        if last[0] is loop:
            return last[1]
        value = self._values.get(loop)
        if value is None:
            value = self._values[loop] = self._make()
        self._last = (loop, value)
        return value

    async def aclose(self) -> None:
        """Close this event loop's value, if it was made; the next ``get`` makes a new one."""
        loop = asyncio.get_running_loop()
        value = self._values.pop(loop, None)
        if self._last[0] is loop:
            self._last = (None, None)
        if value is not None:
            await value.aclose()


async def aclose_all() -> None:
    """Close every holder's value of the running event loop."""
    for holder in _holders:
        await holder.aclose()


async def lifespan(receive, send) -> None:
    """Answer an ASGI lifespan: nothing to open at startup, every holder closed at shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await aclose_all()
            await send({"type": "lifespan.shutdown.complete"})
            return
