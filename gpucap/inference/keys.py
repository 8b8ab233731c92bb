"""API key secrets: how they look, how they are stored, how one is checked.

A key reads ``gpk_<prefix>_<secret>``: the prefix (10 characters) is stored and shown, and finds
the key; the secret (40 characters, 238 bits) is stored only as SHA-256 over a per-key salt and
itself. A secret that long needs no slow hash (that is for guessable passwords); comparing in
constant time keeps its digest from leaking through timing.
"""

import hashlib
import hmac
import re
import secrets
import string

SCHEME = "gpk"
PREFIX_LENGTH = 10
SECRET_LENGTH = 40
_ALPHABET = string.ascii_letters + string.digits
_KEY = re.compile(rf"^{SCHEME}_([A-Za-z0-9]{{{PREFIX_LENGTH}}})_([A-Za-z0-9]{{{SECRET_LENGTH}}})$")


def key_new() -> tuple[str, str, str, str]:
    """A new key: (whole key to show once, prefix, salt, digest to store)."""
    prefix = _random(PREFIX_LENGTH)
    secret = _random(SECRET_LENGTH)
    salt = secrets.token_hex(16)
    return f"{SCHEME}_{prefix}_{secret}", prefix, salt, key_digest(salt, secret)


def key_parse(key: str) -> tuple[str, str] | None:
    """(prefix, secret) of a well-formed key, else None."""
    match = _KEY.match(key)
    return (match.group(1), match.group(2)) if match else None


def key_digest(salt: str, secret: str) -> str:
    return hashlib.sha256(f"{salt}:{secret}".encode()).hexdigest()


def key_matches(*, salt: str, digest: str, secret: str) -> bool:
    return hmac.compare_digest(key_digest(salt, secret), digest)


def _random(length: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))
