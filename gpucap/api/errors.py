"""The REST API's one error shape.

Every error answers ``{"error": {"code": ..., "message": ..., "fields": {field: [reasons]}}}``
whether it came from a serializer, a service (Django ``ValidationError`` / ``Conflict``),
authentication, a missing object, or a path under /api/ that names no endpoint. A store the
request needs that cannot be reached (Redis: the throttles' counts, the caches) is a 503 with
``Retry-After``, code ``unavailable``: the client may retry, and nothing was changed.
"""

import logging

import redis.exceptions
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from gpucap.errors import Conflict

RETRY_AFTER_SECONDS = 1

log = logging.getLogger(__name__)


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def _flatten(detail) -> dict[str, list[str]]:
    """DRF error details (nested dicts/lists) -> {"field.sub": ["reason", ...]}."""
    out: dict[str, list[str]] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                # DRF keys a list's errors by index: {"gpus": {0: {"uuid": [...]}}}.
                if isinstance(key, int):
                    walk(f"{prefix}[{key}]", sub)
                else:
                    walk(f"{prefix}.{key}" if prefix else str(key), sub)
        elif isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
            for index, sub in enumerate(value):
                if sub:
                    walk(f"{prefix}[{index}]", sub)
        else:
            items = value if isinstance(value, list) else [value]
            out.setdefault(prefix or "non_field_errors", []).extend(str(v) for v in items)

    walk("", detail)
    return out


def _validation_message(fields: dict[str, list[str]]) -> str:
    parts = [
        f"{name}: {reason}" if name != "non_field_errors" else reason
        for name, reasons in fields.items()
        for reason in reasons
    ]
    return "; ".join(parts) or "invalid input"


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        fields = (
            {k: [str(m) for m in v] for k, v in exc.message_dict.items()}
            if hasattr(exc, "error_dict")
            else {"non_field_errors": [str(m) for m in exc.messages]}
        )
        return Response(
            error_body("invalid", _validation_message(fields), fields), status.HTTP_400_BAD_REQUEST
        )
    if isinstance(exc, Conflict):
        return Response(error_body(exc.code, exc.message), status.HTTP_409_CONFLICT)
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        log.error("API: Redis unreachable: %s", exc)
        message = "a store this request needs cannot be reached; retry shortly"
        return Response(
            error_body("unavailable", message),
            status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        response.data = error_body("invalid", _validation_message(fields), fields)
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        code = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
        response.data = error_body(
            code if isinstance(code, str) else "error",
            str(detail if not isinstance(detail, (dict, list)) else _flatten(detail)),
        )
    return response


@csrf_exempt
def endpoint_not_found(request, *args, **kwargs) -> JsonResponse:
    """Any /api/ path that names no endpoint: a 404 in the one error shape, not an HTML page."""
    message = f"no API endpoint at {request.path}"
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not endpoint_not_found:
            message += f"; did you mean {request.path}/ (with the trailing slash)?"
    return JsonResponse(error_body("not_found", message), status=404)


# --- the error shape in the OpenAPI schema ----------------------------------------------------


class ApiErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable: invalid, not_found, conflict, ...")
    message = serializers.CharField(help_text="One human-readable sentence naming the problem.")
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="For invalid input: each offending field with its reasons.",
    )


class ApiErrorSerializer(serializers.Serializer):
    error = ApiErrorBodySerializer()
