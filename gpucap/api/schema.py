"""The OpenAPI schema class: drf-spectacular's, documenting the one error shape on every
operation."""

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse

from gpucap.api.errors import ApiErrorSerializer


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's schema, plus the error answers an operation can give, in the one shape
    every error has."""

    _ERRORS = {
        400: "Invalid input; `fields` names each offending field and why.",
        401: "Not authenticated: send `Authorization: Token <key>` or log in.",
        403: "Authenticated, but not allowed to do this.",
        404: "No such object, or not one you may see.",
        409: "Well-formed, but the current state forbids it.",
    }

    # The hook is drf-spectacular's (pinned in requirements.txt): it sees every operation's
    # responses after any @extend_schema override, so errors are documented once, here.
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for code in self._error_codes():
            error = OpenApiResponse(ApiErrorSerializer, description=self._ERRORS[code])
            responses.setdefault(str(code), self._get_response_for_code(error, str(code)))
        return responses

    def _error_codes(self) -> list[int]:
        writes = self.method in ("POST", "PUT", "PATCH", "DELETE")
        guarded = bool(self.view.get_permissions())
        codes = []
        filtered_list = getattr(self.view, "action", None) == "list" and getattr(
            self.view, "filterset_class", None
        )
        if self.method in ("POST", "PUT", "PATCH") or filtered_list:
            codes.append(400)
        if guarded:
            codes += [401, 403]
        if "{" in self.path:
            codes.append(404)
        if writes and guarded:
            codes.append(409)
        return codes
