"""Small strict readers for settings that come from the environment.

Each reader either returns a well-formed value or raises ``ImproperlyConfigured`` naming the
variable and what was wrong with it, so a bad deployment fails at start-up, not at 3 a.m.
Every variable read here is listed in ``.env.example`` and the README.
"""

import base64
import os
import re

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])[a-z]*\s*$")
_RATE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def rate_parse(text: str, *, name: str = "rate") -> tuple[int, int]:
    """``10/15m``, ``20/minute``, ``100/day`` -> (attempts, window in seconds)."""
    match = _RATE.match(text or "")
    if match is None:
        raise ImproperlyConfigured(
            f"{name}={text!r} is not a rate: write attempts/window, e.g. 10/15m or 20/minute"
        )
    attempts, count = int(match[1]), int(match[2] or 1)
    if attempts < 1 or count < 1:
        raise ImproperlyConfigured(f"{name}={text!r}: attempts and window must be at least 1")
    return attempts, count * _RATE_UNITS[match[3]]


def env_rate(name: str, default: str) -> tuple[int, int]:
    """A rate such as ``10/15m``: (attempts, window in seconds)."""
    return rate_parse(os.environ.get(name, default), name=name)


def env_fernet_keys(name: str) -> list[str]:
    """Comma-separated Fernet keys (32 bytes, URL-safe base64), first one first; [] when unset.
    A key that is not one is refused here, at start-up, naming the variable and its place."""
    keys = env_list(name, [])
    for place, key in enumerate(keys, start=1):
        try:
            raw = base64.urlsafe_b64decode(key.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            raw = b""
        if len(raw) != 32:
            raise ImproperlyConfigured(
                f"{name}: key {place} of {len(keys)} is not a Fernet key (32 bytes in URL-safe "
                'base64, 44 characters; make one with `python -c "from cryptography.fernet '
                'import Fernet; print(Fernet.generate_key().decode())"`)'
            )
    return keys
