"""``python -m gpucap.arbiter plan|explain SNAPSHOT.json`` (``-`` reads standard input).

``plan`` prints the plan as the JSON of DESIGN.md section 7; ``explain`` prints the same plan as
tables for people. A snapshot that cannot be planned exits with status 2 and one line per
problem on standard error, never a traceback.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from datetime import UTC, datetime

from gpucap.arbiter.codec import SnapshotError, dump_plan, load_snapshot
from gpucap.arbiter.planner import plan

BAD_INPUT = 2
COMMANDS = ("plan", "explain")


def main(argv: list[str] | None = None, *, keep: list | None = None) -> int:
    """Run the command; ``keep``, if given, holds what the run built (the parsed JSON, the
    snapshot, the plan) for the caller to free, or, as ``__main__`` does, never to."""
    command, snapshot = _arguments(sys.argv[1:] if argv is None else argv)
    # One short run that builds hundreds of thousands of objects and leaves no cycles behind:
    # the cyclic collector would only rescan them, and its cost grows faster than the fleet.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(command, snapshot, [] if keep is None else keep)
    finally:
        if collecting:
            gc.enable()


def _arguments(argv: list[str]) -> tuple[str, str]:
    """``COMMAND SNAPSHOT``. The usual two plain words are taken as they are: argparse (a few
    milliseconds to import, on every run) only reads anything else (options such as --help,
    a wrong command, a missing or extra word) and words its usage and errors."""
    if len(argv) == 2 and argv[0] in COMMANDS and (argv[1] == "-" or not argv[1].startswith("-")):
        return argv[0], argv[1]
    import argparse  # only for what the fast path above does not read

    parser = argparse.ArgumentParser(
        prog="python -m gpucap.arbiter",
        description="Plan GPU reclaims for one capacity set from a snapshot file, offline.",
    )
    parser.add_argument("command", choices=COMMANDS, help="plan: JSON; explain: tables")
    parser.add_argument("snapshot", help="snapshot JSON file (DESIGN.md section 7), or - for stdin")
    args = parser.parse_args(argv)
    return args.command, args.snapshot


def _run(command: str, path: str, keep: list) -> int:
    try:
        snapshot = load_snapshot(_read(path), keep=keep)
    except OSError as error:
        print(f"{path}: cannot read: {error.strerror or error}", file=sys.stderr)
        return BAD_INPUT
    except SnapshotError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return BAD_INPUT
    if snapshot.now is None:
        snapshot = dataclasses.replace(snapshot, now=datetime.now(UTC))
    result = plan(snapshot)
    keep += (snapshot, result)
    if command == "plan":
        text = dump_plan(result)
    else:
        from gpucap.arbiter.explain import render_plan  # only explain needs it

        text = render_plan(snapshot, result)
    # UTF-8 whatever the locale: reasons say "4 → 0", and the JSON keeps names as written.
    sys.stdout.buffer.write(text.encode())
    sys.stdout.flush()
    return 0


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as snapshot_file:
        return snapshot_file.read()
