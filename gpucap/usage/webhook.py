"""Signing billing webhook deliveries, and checking a signature on the receiving side.

Standard library only, so a receiver can copy this file as it is. The signature header reads

    Gpucap-Signature: t=1764460800,v1=5f2b…(64 hex digits)

where ``v1`` is HMAC-SHA256, keyed with the webhook's secret, over ``<t>.<raw request body>``
(the timestamp, a dot, then the body's bytes exactly as received). A receiver checks it with
``verify_signature`` before it parses the body, and refuses a timestamp older than its tolerance
so a captured delivery cannot be replayed later.
"""

import hashlib
import hmac
import secrets
import time

SIGNATURE_HEADER = "Gpucap-Signature"
BATCH_HEADER = "Gpucap-Batch"
ATTEMPT_HEADER = "Gpucap-Attempt"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SCHEME = "v1"
DEFAULT_TOLERANCE_SECONDS = 300


def signature_header(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The ``Gpucap-Signature`` value for ``body`` sent at ``timestamp`` (Unix seconds)."""
    timestamp = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={timestamp},{SCHEME}={_digest(secret, timestamp, body)}"


def verify_signature(
    secret: str,
    header: str | None,
    body: bytes,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    *,
    now: float | None = None,
) -> bool:
    """True when ``header`` (the ``Gpucap-Signature`` value) signs ``body`` with ``secret`` and
    its timestamp is within ``tolerance`` seconds of ``now`` (default: the clock)."""
    if not header:
        return False
    timestamp, candidates = None, []
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == SCHEME:
            candidates.append(value)
    if timestamp is None or not candidates:
        return False
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance:
        return False
    expected = _digest(secret, timestamp, body)
    # Constant-time: a receiver must not leak how much of a forged signature was right.
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)


def new_secret() -> str:
    """A random secret of 43 URL-safe characters (256 bits)."""
    return secrets.token_urlsafe(32)


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
