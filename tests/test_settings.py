"""Settings come from the environment through strict readers; the Celery app is wired."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from gpucap.envvars import env_bool, env_int, env_list


def test_env_bool_reads_common_spellings_and_refuses_the_rest(monkeypatch):
    monkeypatch.setenv("GPUCAP_FLAG", "yes")
    assert env_bool("GPUCAP_FLAG", False) is True
    monkeypatch.setenv("GPUCAP_FLAG", "0")
    assert env_bool("GPUCAP_FLAG", True) is False
    monkeypatch.setenv("GPUCAP_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="GPUCAP_FLAG='maybe' is not a boolean"):
        env_bool("GPUCAP_FLAG", False)


def test_env_int_names_the_variable_when_it_is_wrong(monkeypatch):
    monkeypatch.setenv("GPUCAP_N", "ten")
    with pytest.raises(ImproperlyConfigured, match="GPUCAP_N='ten' is not an integer"):
        env_int("GPUCAP_N", 1)
    monkeypatch.setenv("GPUCAP_N", "-3")
    with pytest.raises(ImproperlyConfigured, match="GPUCAP_N=-3 must be at least 0"):
        env_int("GPUCAP_N", 1, minimum=0)
    monkeypatch.delenv("GPUCAP_N")
    assert env_int("GPUCAP_N", 7) == 7


def test_env_list_splits_on_commas(monkeypatch):
    monkeypatch.setenv("GPUCAP_HOSTS", " a.example , b.example,,")
    assert env_list("GPUCAP_HOSTS", []) == ["a.example", "b.example"]


def test_celery_app_uses_redis_and_knows_the_beat_tasks():
    from gpucap.celery import app

    app.loader.import_default_modules()
    assert app.conf.broker_url.startswith("redis://")
    for entry in app.conf.beat_schedule.values():
        assert entry["task"] in app.tasks, f"beat names unknown task {entry['task']}"


def test_production_settings_refuse_to_start_without_a_secret_key():
    result = subprocess.run(
        [sys.executable, "-c", "import gpucap.settings"],
        env={"DEBUG": "0", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


def _settings_with(env: dict) -> dict:
    """Some settings as gpucap.settings computes them from ``env`` alone, in a fresh process."""
    script = (
        "import json, gpucap.settings as s; "
        "print(json.dumps({'SIMULATOR_ENABLED': s.SIMULATOR_ENABLED}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
    )
    return json.loads(result.stdout)


def test_the_model_simulator_is_off_in_production_unless_enabled():
    production = {"DEBUG": "0", "SECRET_KEY": "x" * 50}

    assert _settings_with(production)["SIMULATOR_ENABLED"] is False
    assert _settings_with({**production, "SIMULATOR_ENABLED": "1"})["SIMULATOR_ENABLED"] is True
    assert _settings_with({})["SIMULATOR_ENABLED"] is True  # a developer's machine
