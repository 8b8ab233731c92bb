"""How often a password form may be tried: per account (the username or address typed) and
per client address, each within a window (``PASSWORD_ATTEMPTS_PER_ACCOUNT``,
``PASSWORD_ATTEMPTS_PER_CLIENT``). Counts live in the cache, which every web process shares
(as the API token throttle's do). Once either count is used up, every attempt is refused until
its window ends, the right password included: a guesser learns nothing while they wait. A
successful sign-in resets nothing, so it cannot clear the count of another account or address.

The sign-in forms count failures; the forms that mail a link or set a password count every
attempt (``PasswordAttemptsMixin``).
"""

import hashlib
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.http import HttpRequest

# Tests give each run a prefix of their own (the cache is shared).
KEY_PREFIX = "password-attempts"


@dataclass(frozen=True)
class Rate:
    attempts: int
    seconds: int


def wait_seconds(*, request: HttpRequest, account: str) -> int:
    """How long until this account and this client may try again; 0 if they may now."""
    now = time.time()
    waits = [
        _window_end(now, rate) - now
        for key, rate in _counters(request, account, now)
        if (cache.get(key) or 0) >= rate.attempts
    ]
    return math.ceil(max(waits)) if waits else 0


def attempt_record(*, request: HttpRequest, account: str) -> None:
    """Count one attempt (or failure) against the account and the client address."""
    now = time.time()
    for key, rate in _counters(request, account, now):
        # add() makes the key only if it is missing; the window's end is in its name.
        cache.add(key, 0, timeout=rate.seconds + 1)
        try:
            cache.incr(key)
        except ValueError:  # expired between the two calls: a fresh window
            cache.add(key, 1, timeout=rate.seconds + 1)


def refusal(seconds: int) -> ValidationError:
    """The message a throttled form shows: when to try again."""
    wait = f"{seconds} seconds" if seconds < 90 else f"{math.ceil(seconds / 60)} minutes"
    at = time.strftime("%H:%M:%S", time.gmtime(time.time() + seconds))
    return ValidationError(
        f"Too many attempts for this account or from your address. Try again in {wait} "
        f"(at {at} UTC).",
        code="throttled",
    )


def client_address(request: HttpRequest) -> str:
    """The peer's address; never a client-sent X-Forwarded-For (a guesser would pick a fresh
    one each time)."""
    return request.META.get("REMOTE_ADDR", "") or "unknown"


def _counters(request: HttpRequest, account: str, now: float) -> list[tuple[str, Rate]]:
    per_account = Rate(*settings.PASSWORD_ATTEMPTS_PER_ACCOUNT)
    per_client = Rate(*settings.PASSWORD_ATTEMPTS_PER_CLIENT)
    # Hashed: an address or username typed by anyone never lands in the cache's key space raw.
    who = hashlib.sha256(account.strip().lower().encode()).hexdigest()[:32]
    where = hashlib.sha256(client_address(request).encode()).hexdigest()[:32]
    counters = [
        (f"{KEY_PREFIX}:client:{where}:{_window(now, per_client)}", per_client),
    ]
    if account.strip():
        counters.append((f"{KEY_PREFIX}:account:{who}:{_window(now, per_account)}", per_account))
    return counters


def _window(now: float, rate: Rate) -> int:
    return int(now // rate.seconds)


def _window_end(now: float, rate: Rate) -> float:
    return (_window(now, rate) + 1) * rate.seconds


class PasswordAttemptsMixin:
    """For a form that takes a password or mails a link: ``clean()`` refuses while this
    account or client address has used up its attempts, before anything else is checked, and
    marks the request (``request.password_attempts_wait``) so the view answers 429.

    ``attempts_account()`` names the account; ``attempts_count`` is "failures" (sign-in: only
    a refused password counts) or "attempts" (every post counts). The form needs ``request``."""

    attempts_count = "attempts"
    request: HttpRequest | None = None

    def attempts_account(self) -> str:
        raise NotImplementedError

    def clean(self):
        request = self.request
        if request is None:
            return super().clean()
        account = self.attempts_account() or ""
        wait = wait_seconds(request=request, account=account)
        if wait:
            request.password_attempts_wait = wait
            raise refusal(wait)
        if self.attempts_count == "attempts":
            attempt_record(request=request, account=account)
            return super().clean()
        try:
            return super().clean()
        except ValidationError:
            attempt_record(request=request, account=account)
            raise
