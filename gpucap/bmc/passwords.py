"""BMC passwords sealed at rest (docs/bmc.md, Models): Fernet tokens under the keys of
``BMC_CREDENTIAL_KEYS``.

The first key seals; every key opens, so a key is rotated by putting a new one first, running
``manage.py bmc_rotate_keys`` (every token sealed again with the new key), then dropping the
old one. gpucap needs the password itself to speak to the BMC, so it is sealed, not hashed.
"""

import base64
import hashlib
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class SealError(Exception):
    """A password that cannot be sealed or opened; the message says what to do."""


def password_seal(password: str) -> str:
    """The token stored for ``password``."""
    return _keys().encrypt(password.encode()).decode("ascii")


def password_open(token: str, *, node: str) -> str:
    """The password a token seals. ``node`` names the machine in the error."""
    try:
        return _keys().decrypt(token.encode("ascii")).decode()
    except InvalidToken:
        raise SealError(_unopenable(node)) from None


def password_reseal(token: str, *, node: str) -> str:
    """The same password sealed with the first key (``bmc_rotate_keys``)."""
    try:
        return _keys().rotate(token.encode("ascii")).decode("ascii")
    except InvalidToken:
        raise SealError(_unopenable(node)) from None


def _unopenable(node: str) -> str:
    return (
        f"node {node}: its BMC password cannot be opened with the keys in BMC_CREDENTIAL_KEYS "
        "(sealed with a key no longer there?); set the password again"
    )


def _keys() -> MultiFernet:
    return _fernet(tuple(settings.BMC_CREDENTIAL_KEYS), settings.DEBUG, settings.SECRET_KEY)


@cache
def _fernet(keys: tuple[str, ...], debug: bool, secret_key: str) -> MultiFernet:
    if not keys:
        if not debug:
            raise SealError(
                "BMC_CREDENTIAL_KEYS is not set: gpucap has no key to seal BMC passwords with "
                "(docs/bmc.md)"
            )
        # A developer's machine: a key of its own from SECRET_KEY, so the demo works.
        digest = hashlib.sha256(f"gpucap-bmc-passwords:{secret_key}".encode()).digest()
        keys = (base64.urlsafe_b64encode(digest).decode("ascii"),)
    return MultiFernet([Fernet(key) for key in keys])
