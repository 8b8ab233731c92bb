"""gpucap.edge.loops: one value per event loop, and the lifespan that closes them all."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

from gpucap.edge import loops
from gpucap.edge.loops import PerLoop
from tests.conftest import run_in_new_loop


class Client:
    closed = False

    async def aclose(self) -> None:
        self.closed = True


def test_per_loop_makes_one_value_per_event_loop():
    holder = PerLoop(Client)

    async def twice():
        return holder.get(), holder.get()

    first, again = run_in_new_loop(twice)
    assert first is again
    (other, _) = run_in_new_loop(twice)
    assert other is not first


def test_the_lifespan_shutdown_closes_every_holder_of_its_loop():
    holders = [PerLoop(Client), PerLoop(Client)]

    async def serve_then_shut_down():
        clients = [holder.get() for holder in holders]
        messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        said = []

        async def receive():
            return messages.pop(0)

        async def send(message):
            said.append(message["type"])

        await loops.lifespan(receive, send)
        # Closed and forgotten: the next use in this loop makes a new one.
        fresh = holders[0].get()
        return clients, said, fresh

    clients, said, fresh = run_in_new_loop(serve_then_shut_down)
    assert said == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert all(client.closed for client in clients)
    assert fresh not in clients and not fresh.closed


def test_closing_one_loop_leaves_another_loops_value_open():
    holder = PerLoop(Client)
    other_loop = asyncio.new_event_loop()
    try:
        kept = _run_in_thread(other_loop, _get(holder))

        async def close_here():
            holder.get()
            await holder.aclose()

        run_in_new_loop(close_here)
        assert not kept.closed
        assert _run_in_thread(other_loop, _get(holder)) is kept
    finally:
        other_loop.close()


async def _get(holder):
    return holder.get()


def _run_in_thread(loop: asyncio.AbstractEventLoop, coroutine):
    """``loop.run_until_complete`` in a thread of its own: after a browser test the main thread
    is marked as running a loop (see ``run_in_new_loop``), and a second loop cannot run there."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(loop.run_until_complete, coroutine).result()
