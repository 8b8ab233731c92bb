"""The REST API's one error shape.

Every error answers ``{"error": {"code": ..., "message": ..., "fields": {field: [reasons]}}}``
whether it came from a serializer, a service (Django ``ValidationError`` / ``Conflict``),
authentication, a missing object, or a path under /api/ that names no endpoint. A store the
request needs that cannot be reached (Redis: the throttles' counts, the caches) is a 503 with
``Retry-After``, code ``unavailable``: the client may retry, and nothing was changed.

Anything unhandled becomes a 500 in the same shape, in every mode: the message carries a
request id (also in the ``X-Request-Id`` header), and the log has that id with the traceback.
The exception handler catches what a view raised; ``ApiErrors``, the outermost middleware,
turns what failed before or around a view (another middleware, a body too large to read)
into the same shape instead of Django's HTML pages.
"""

import logging
import sys
import uuid

import redis.exceptions
from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from django.urls import Resolver404, resolve
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from gpucap import inputs
from gpucap.errors import Conflict

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"
REQUEST_ID_HEADER = "X-Request-Id"
RETRY_AFTER_SECONDS = 1


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
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        message = f"The request body is over {limit} bytes."
        return Response(error_body("too_large", message), status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
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
        logger.error("API: Redis unreachable: %s", exc)
        message = "a store this request needs cannot be reached; retry shortly"
        return Response(
            error_body("unavailable", message),
            status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)

    response = drf_exception_handler(exc, context)
    if response is None:
        set_rollback()
        return server_error(context["request"], exc)
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


def server_error(request, exc: BaseException) -> Response:
    """A 500 in the error shape for an exception nobody handled, logged with its request id."""
    request_id = uuid.uuid4().hex
    logger.error(
        "unhandled error in %s %s (request id %s)",
        request.method,
        request.path,
        request_id,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return Response(
        _server_error_body(request_id),
        status.HTTP_500_INTERNAL_SERVER_ERROR,
        headers={REQUEST_ID_HEADER: request_id},
    )


def _server_error_body(request_id: str) -> dict:
    return error_body(
        "server_error",
        f"Something went wrong on our side (request id {request_id}); "
        "the operators can find it in the log with that id.",
    )


class ApiErrors:
    """Outermost middleware: under /api/, whatever Django would answer with an HTML error page
    (an exception in a middleware or a view outside DRF, a body over
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``, a suspicious request) is answered in the error shape."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        problem = _query_problem(request)
        if problem is not None:
            return problem
        return self.get_response(request)

    def process_exception(self, request, exc):
        """A view outside DRF raised (DRF's own views go through ``exception_handler``)."""
        if not request.path.startswith(API_PREFIX):
            return None
        if isinstance(exc, RequestDataTooBig):
            return _too_large()
        response = server_error(request, exc)
        return JsonResponse(response.data, status=response.status_code, headers=response.headers)


def _query_problem(request) -> JsonResponse | None:
    """Query parameters reach filters and the database: a control character or lone surrogate
    (or a bidi control in a name) is a 400 naming the parameter, before any view runs."""
    for name, values in request.GET.lists():
        for value in [name, *values]:
            reason = inputs.text_problem(value, name=inputs.is_name_field(name))
            if reason is not None:
                fields = {name: [reason]}
                body = error_body("invalid", _validation_message(fields), fields)
                return JsonResponse(body, status=400)
    return None


def _too_large() -> JsonResponse:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    message = f"The request body is over {limit} bytes."
    return JsonResponse(error_body("too_large", message), status=413)


def handler400(request, exception=None):
    """Django's 400 (a suspicious request, a body too large to read): JSON under /api/."""
    if request.path.startswith(API_PREFIX):
        if isinstance(exception, RequestDataTooBig):
            return _too_large()
        return JsonResponse(error_body("bad_request", "The request is malformed."), status=400)
    return defaults.bad_request(request, exception)


def handler500(request):
    """Django's 500 (an exception outside any view's handling): JSON under /api/, logged
    with its request id; the site's own page elsewhere."""
    if not request.path.startswith(API_PREFIX):
        return defaults.server_error(request)
    request_id = uuid.uuid4().hex
    logger.error(
        "unhandled error in %s %s (request id %s)",
        request.method,
        request.path,
        request_id,
        exc_info=sys.exc_info(),
    )
    return JsonResponse(
        _server_error_body(request_id), status=500, headers={REQUEST_ID_HEADER: request_id}
    )


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
