"""The OpenAPI schema: drf-spectacular's, told what it cannot see in the code, so that what it
promises is what the API does (tests/test_api_fuzz.py holds the API to it):

- every error answer an operation can give, in the one shape every error has (``AutoSchema``),
  and the request shapes that refuse fields they do not know;
- the characters every request's text refuses (``gpucap.inputs``), as a pattern on every
  string a request carries, so a client knows before it is told 400;
- an answer that has one of several shapes has exactly one: the shapes are closed.
"""

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse

from gpucap import inputs
from gpucap.api.errors import ApiErrorSerializer


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's schema, plus the error answers an operation can give, in the one shape
    every error has."""

    _ERRORS = {
        400: "Invalid input; `fields` names each offending field and why. Any operation: a query "
        "parameter with a control character is refused before any view runs.",
        401: "Not authenticated: send `Authorization: Token <key>` or log in.",
        403: "Authenticated, but not allowed to do this.",
        404: "No such object, or not one you may see.",
        409: "Well-formed, but the current state forbids it.",
        413: "The request body is over the size limit (`DATA_UPLOAD_MAX_MEMORY_SIZE`).",
        429: "Too many attempts; retry after the `Retry-After` header's seconds.",
        500: "Something failed on our side; `message` carries a request id (also in the "
        "`X-Request-Id` header) under which the operators find it in the log.",
        503: "A store this request needs (Redis) cannot be reached; nothing was changed. Retry "
        "after the `Retry-After` header's seconds.",
    }

    # The hook is drf-spectacular's (pinned in requirements.txt): it sees every operation's
    # responses after any @extend_schema override, so errors are documented once, here.
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for code in self._error_codes():
            error = OpenApiResponse(ApiErrorSerializer, description=self._ERRORS[code])
            responses.setdefault(str(code), self._get_response_for_code(error, str(code)))
        return responses

    def _map_serializer(self, serializer, direction, bypass_extensions=False):
        """A request shape whose serializer refuses fields it does not know (``InputSerializer``)
        says so: ``additionalProperties: false``."""
        schema = super()._map_serializer(serializer, direction, bypass_extensions)
        if direction == "request" and getattr(serializer, "refuses_unknown_fields", False):
            schema["additionalProperties"] = False
        return schema

    def _error_codes(self) -> list[int]:
        writes = self.method in ("POST", "PUT", "PATCH", "DELETE")
        guarded = bool(self.view.get_permissions())
        codes = [400]
        if guarded:
            codes += [401, 403]
        if "{" in self.path:
            codes.append(404)
        if writes and guarded:
            codes.append(409)
        if self.method in ("POST", "PUT", "PATCH"):
            codes.append(413)
        if self.view.get_throttles():
            codes.append(429)
        return [*codes, 500, 503]


def postprocess_schema(result, generator, request, public):
    """drf-spectacular postprocessing hook (``SPECTACULAR_SETTINGS``): refused text as
    patterns on what requests carry, and the shapes of a ``oneOf`` closed."""
    components = result.get("components", {}).get("schemas", {})
    for path_item in result["paths"].values():
        for operation in path_item.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "query":
                    _refuse_text(parameter["schema"], components, parameter["name"], set())
            for content in operation.get("requestBody", {}).get("content", {}).values():
                _refuse_text(content["schema"], components, "", set())
    for schema in components.values():
        _close_shapes(schema, components)
    return result


_TEXT = inputs.text_pattern()
_NAME = inputs.text_pattern(name=True)


def _refuse_text(schema: dict, components: dict, path: str, seen: set) -> None:
    """Give every free string under ``schema`` (reached at field ``path``) the pattern of the
    text ``gpucap.inputs`` takes there: a name's where the path is a name. A component reached
    both as a name and as text is documented as a name, the stricter."""
    name = inputs.is_name_field(path)
    if "$ref" in schema:
        component = schema["$ref"].rsplit("/", 1)[-1]
        if (component, name) not in seen:
            seen.add((component, name))
            _refuse_text(components[component], components, path, seen)
        return
    free = not {"enum", "format"} & schema.keys() and schema.get("pattern") in (None, _TEXT)
    if schema.get("type") == "string" and free and (name or "pattern" not in schema):
        schema["pattern"] = _NAME if name else _TEXT
    for key in ("oneOf", "anyOf", "allOf"):
        for branch in schema.get(key, []):
            _refuse_text(branch, components, path, seen)
    if isinstance(schema.get("items"), dict):
        _refuse_text(schema["items"], components, f"{path}[0]", seen)
    for field, sub in schema.get("properties", {}).items():
        _refuse_text(sub, components, f"{path}.{field}" if path else field, seen)
    if isinstance(schema.get("additionalProperties"), dict):
        _refuse_text(schema["additionalProperties"], components, f"{path}.*", seen)


def _close_shapes(schema: dict, components: dict) -> None:
    """An answer that is one of several shapes (a pool as an operator or as a tenant sees it)
    has the fields of exactly one: each shape is closed to fields it does not list. Open, the
    operator's pool also matched the tenant's shape, its few fields being among the pool's."""
    if "oneOf" not in schema or "discriminator" in schema:
        return
    for branch in schema["oneOf"]:
        if "$ref" in branch:
            components[branch["$ref"].rsplit("/", 1)[-1]]["additionalProperties"] = False
