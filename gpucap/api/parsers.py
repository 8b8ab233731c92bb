"""The API's request parsers: JSON, form and multipart bodies, each checked once for every
endpoint (``gpucap.inputs``) before a serializer sees them: JSON nested too deep, and text
with a control character, a lone surrogate or (in a name) a bidi control, is a 400 naming
the field. (A body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is refused by Django as it is read:
a 413, gpucap.api.errors.)"""

from django.http import QueryDict
from rest_framework import exceptions, parsers, serializers
from rest_framework.settings import api_settings
from rest_framework.utils import json as drf_json

from gpucap import inputs


def refuse_bad_text(data) -> None:
    """A 400 naming the first field whose text (or nesting) cannot be taken."""
    if isinstance(data, QueryDict):
        data = {key: values[0] if len(values) == 1 else values for key, values in data.lists()}
    problem = inputs.data_problem(data)
    if problem is not None:
        field, reason = problem
        raise serializers.ValidationError({field: [reason]})


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = parsers.get_encoding(parser_context or {})
        constant = drf_json.strict_constant if api_settings.STRICT_JSON else None
        try:
            text = stream.read().decode(encoding)
            data = inputs.json_loads(text, parse_constant=constant)
        except ValueError as exc:  # malformed, undecodable or nested too deep
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        refuse_bad_text(data)
        return data


class FormParser(parsers.FormParser):
    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        refuse_bad_text(data)
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        parsed = super().parse(stream, media_type, parser_context)
        refuse_bad_text(parsed.data)
        return parsed
