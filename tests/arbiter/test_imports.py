"""The planning core stays plain Python: nothing under gpucap/arbiter imports Django, Celery,
DRF or a database or cache driver (STYLE.md), and the CLI starts without Django."""

import ast
import os
import subprocess
import sys
from pathlib import Path

ARBITER = Path(__file__).resolve().parents[2] / "gpucap" / "arbiter"
FORBIDDEN = (
    "django",
    "celery",
    "kombu",
    "rest_framework",
    "psycopg",
    "psycopg2",
    "redis",
    "sqlalchemy",
    "sqlite3",
    "pymysql",
    "MySQLdb",
    "asyncpg",
    "gpucap.fleet",
    "gpucap.rentals",
    "gpucap.plans",
    "gpucap.notices",
    "gpucap.drivers",
    "gpucap.inference",
    "gpucap.usage",
    "gpucap.tenancy",
    "gpucap.settings",
    "gpucap.celery",
)


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            names += [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
    return names


def test_nothing_under_the_arbiter_imports_django_celery_or_a_database():
    files = sorted(ARBITER.rglob("*.py"))
    assert len(files) >= 8
    offending = [
        f"{path.relative_to(ARBITER.parent.parent)} imports {name}"
        for path in files
        for name in imported_modules(path)
        if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN)
    ]
    assert offending == []


def test_the_cli_runs_without_loading_django_or_celery():
    root = ARBITER.parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    probe = (
        "import sys, runpy; sys.argv = ['arbiter', 'plan', 'tests/arbiter/design_example.json'];"
        "import gpucap.arbiter.cli as cli; code = cli.main();"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'kombu')];"
        "print(loaded, file=sys.stderr); sys.exit(code or (1 if loaded else 0))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
