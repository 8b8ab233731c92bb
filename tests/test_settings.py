"""Settings come from the environment through strict readers; the Celery app is wired."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from gpucap.envvars import env_bool, env_fernet_keys, env_int, env_list


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


def test_env_fernet_keys_refuses_what_is_not_a_key_naming_its_place(monkeypatch):
    key = "dGVzdHMtb25seS1ibWMta2V5LTMyLWJ5dGVzLWxvbmc="
    monkeypatch.setenv("GPUCAP_KEYS", f"{key}, hunter2")
    with pytest.raises(ImproperlyConfigured, match="GPUCAP_KEYS: key 2 of 2 is not a Fernet key"):
        env_fernet_keys("GPUCAP_KEYS")
    monkeypatch.setenv("GPUCAP_KEYS", key)
    assert env_fernet_keys("GPUCAP_KEYS") == [key]
    monkeypatch.delenv("GPUCAP_KEYS")
    assert env_fernet_keys("GPUCAP_KEYS") == []


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


ROOT = Path(__file__).resolve().parent.parent
# What a production deployment sets (README, "Configuration"); everything else at its default.
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": "k3J9vQ2xL7pR4tW8yZ1cF6hN0bM5dG3sA9eU2iO7uY4rT1wQ8zX6",
    "ALLOWED_HOSTS": "gpucap.example.com",
}


def _in_django(env: dict, code: str):
    """What ``code`` (with Django set up on ``env`` alone, in a fresh process) leaves in
    ``result``, JSON-decoded."""
    script = f"import django, json\ndjango.setup()\n{code}\nprint(json.dumps(result))"
    completed = subprocess.run(
        [sys.executable, "-c", script],
        env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "gpucap.settings", **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.splitlines()[-1])


def test_the_model_simulator_is_off_in_production_unless_enabled():
    enabled = "from django.conf import settings\nresult = settings.SIMULATOR_ENABLED"

    assert _in_django(PRODUCTION, enabled) is False
    assert _in_django({**PRODUCTION, "SIMULATOR_ENABLED": "1"}, enabled) is True
    assert _in_django({}, enabled) is True  # a developer's machine


def test_manage_py_check_deploy_is_clean_with_production_settings():
    completed = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env={"PATH": "/usr/bin:/bin", **PRODUCTION},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )

    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "System check identified no issues" in completed.stdout, completed.stdout


BUILD_URL = """
from django.test import RequestFactory
request = RequestFactory().get(
    "/invitations/x/", HTTP_HOST="gpucap.example.com", HTTP_X_FORWARDED_PROTO="https"
)
result = [request.build_absolute_uri(), request.is_secure()]
"""


def test_urls_come_out_https_behind_a_trusted_tls_proxy():
    trusted = {**PRODUCTION, "TRUST_X_FORWARDED_PROTO": "1"}

    assert _in_django(trusted, BUILD_URL) == ["https://gpucap.example.com/invitations/x/", True]


def test_x_forwarded_proto_is_ignored_unless_trusted():
    assert _in_django(PRODUCTION, BUILD_URL) == ["http://gpucap.example.com/invitations/x/", False]


def test_production_redirects_to_https_and_sends_hsts_but_lets_healthz_answer_over_http():
    code = """
from django.test import Client
client = Client()
page = client.get("/login/")
secure = client.get("/login/", secure=True)
result = [page.status_code, page.headers.get("Location"), client.get("/healthz").status_code,
          secure.headers.get("Strict-Transport-Security")]
"""
    env = {**PRODUCTION, "ALLOWED_HOSTS": "testserver"}

    status, location, healthz, hsts = _in_django(env, code)
    assert (status, location, healthz) == (301, "https://testserver/login/", 200)
    assert hsts == "max-age=31536000; includeSubDomains; preload"


def test_pages_carry_a_content_security_policy_with_no_inline_script_and_no_eval(client, db):
    policy = client.get("/login/").headers["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))

    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert directives["default-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe-eval" not in policy


def test_every_setting_read_from_the_environment_is_documented():
    names = set(
        re.findall(r'env_\w+\(\s*"([A-Z0-9_]+)"', (ROOT / "gpucap/settings.py").read_text())
    )
    example = (ROOT / ".env.example").read_text()
    readme = (ROOT / "README.md").read_text()

    assert names, "no settings found"
    assert [name for name in sorted(names) if f"{name}=" not in example] == []
    assert [name for name in sorted(names) if f"`{name}`" not in readme] == []
