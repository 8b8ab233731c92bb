"""The capacity arbiter's planning core: plain Python, no Django, Celery or database.

``plan(snapshot) -> Plan`` decides which demands get GPUs and which VMs give them up, following
DESIGN.md sections 2 and 3. `model` holds the frozen dataclasses, `codec` the JSON files of
section 7, `validation` the checks a snapshot must pass, `explain` the words operators read, and
``python -m gpucap.arbiter`` the offline CLI.
"""

from gpucap.arbiter.codec import SnapshotError, dump_plan, load_snapshot, plan_to_dict
from gpucap.arbiter.planner import disruption_cost, plan
from gpucap.arbiter.validation import snapshot_problems

__all__ = [
    "SnapshotError",
    "disruption_cost",
    "dump_plan",
    "load_snapshot",
    "plan",
    "plan_to_dict",
    "snapshot_problems",
]
