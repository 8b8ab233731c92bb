"""Every list endpoint's pagination: ``?limit=`` and ``?offset=`` are bounded whole numbers, or
a 400 naming the parameter. Unbounded, ``?limit=99999999999999999999`` reached PostgreSQL as
an out-of-range bigint (a 500), and a malformed one was silently replaced by the default."""

import re

from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 1000
MAX_OFFSET = 2**31 - 1


def query_integer(request, name: str, *, minimum: int, maximum: int, default: int) -> int:
    """A whole-number query parameter within [minimum, maximum], or a 400 naming it."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    text = raw.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise serializers.ValidationError({name: [f"{raw[:40]!r} is not a whole number"]})
    # More digits than any bound has is out of range without asking int() to read them all.
    value = int(text) if len(text) <= 20 else (maximum + 1 if text[0] != "-" else minimum - 1)
    if not minimum <= value <= maximum:
        raise serializers.ValidationError({name: [f"must be between {minimum} and {maximum}"]})
    return value


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request) -> int:
        return query_integer(
            request,
            self.limit_query_param,
            minimum=1,
            maximum=self.max_limit,
            default=self.default_limit,
        )

    def get_offset(self, request) -> int:
        return query_integer(
            request, self.offset_query_param, minimum=0, maximum=MAX_OFFSET, default=0
        )

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
            self.offset_query_param: {"minimum": 0, "maximum": MAX_OFFSET},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters
