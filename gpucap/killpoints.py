"""Kill points: named places in the services where a test makes its worker die at once, as an
OOM killer or a lost machine would, to show that what a dead worker leaves behind is consistent
wherever it dies (tests/plans/test_concurrency.py). A race against a clock cannot say where a
kill landed; a kill point can.

Inert unless the ``TEST_KILL_AT`` setting (environment) names the point: unset, as in
production, a point is one string comparison. Dying is SIGKILL to the whole process group (the
Celery main process and its pool children, which share it), so that no other process of the
worker runs on after the point, and so that the late acknowledgement does not hand the task
straight back to the same worker; run a worker with it set in a session of its own, as the
tests' ``workers`` fixture does. (tests/notices/test_deadline_kills.py kills one at a deadline.)

Points (``name``: where the worker dies):

- ``plans.apply:start``: a plan is made and about to be applied; nothing of it is done;
- ``plans.apply:notices-sent``: its notices are issued, its placements not yet acted on or
  recorded, nothing committed;
- ``plans.apply:placements-recorded``: all of it is done and recorded, not yet committed;
- ``plans.apply:committed``: the apply has committed; the tasks it sends on commit (scheduled
  stops at the notices' deadlines, provisioning) are not sent;
- ``plans.placements:placed``: a waiting placement was completed and committed; its
  provisioning task is not sent;
- ``notices.deadline:stopping``: a notice's deadline came and its VM is ``stopping`` in the
  database (committed); the driver's stop (``rentals.vm_stop``) is not sent.
"""

import os
import signal

from django.conf import settings

from gpucap.tasks import on_commit


def kill_point(name: str) -> None:
    """Die here when ``TEST_KILL_AT`` names this point."""
    if name == settings.TEST_KILL_AT:
        _die(name)


def kill_point_on_commit(name: str) -> None:
    """Die as soon as the current transaction commits, before the on-commit work registered
    after this call, when ``TEST_KILL_AT`` names this point. Nothing happens if it rolls back."""
    if name == settings.TEST_KILL_AT:
        # First among first: ahead of the driver tasks registered after it.
        on_commit(lambda: _die(name), what=f"kill point {name}", first=True)


def _die(name: str) -> None:
    # Straight to file descriptor 2 (Celery wraps sys.stderr in a logger): the test reads where
    # the worker died from its log.
    os.write(2, f"kill point {name}: SIGKILL to process group {os.getpgrp()}\n".encode())
    os.killpg(os.getpgrp(), signal.SIGKILL)
