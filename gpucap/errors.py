"""Domain errors shared by services, the API and pages.

Input problems raise Django's ``ValidationError`` with a dict of field -> messages, so the API
and the forms can point at the field. A request that is well-formed but collides with the
current state raises ``Conflict`` (HTTP 409).
"""


class Conflict(Exception):
    """The request is valid but the current state forbids it (HTTP 409)."""

    def __init__(self, message: str, *, code: str = "conflict") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
