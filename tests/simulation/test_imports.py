"""The simulation is plain Python like the arbiter: it loads without Django or Celery."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_simulation_runs_without_loading_django_or_celery():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    probe = (
        "import sys; import gpucap.simulation, gpucap.simulation.engine;"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'kombu')];"
        "print(loaded, file=sys.stderr); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
