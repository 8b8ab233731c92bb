"""Pausing Python's cyclic garbage collector around work that builds many objects at once.

Reading a 2,000-node capacity set builds hundreds of thousands of objects (model instances,
snapshot dataclasses, plan lines) that form no reference cycles. With the collector on, every
few hundred of them trigger a collection, and the oldest generation's collections scan every
object the process holds, a heap that grows with the fleet: they cost as much as the read
itself. Nothing cyclic is left behind by such work, and whatever is waits for the next
collection once the collector runs again. The planner CLI does the same
(gpucap/arbiter/cli.py).
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside the block. Process-wide, as the collector is: a thread
    that enters while another holds it paused leaves it as it found it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
