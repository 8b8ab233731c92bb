"""The URL resolver walked for the tests that check every route (#16): the operators' read-only
view of tenants (tests/test_operator_read_only.py) and the tenant-isolation matrix
(tests/isolation/). A route added tomorrow is in both the day it is added."""

import re

from django.urls import URLResolver, get_resolver

from gpucap.api.permissions import IsOperator, IsOperatorOrReadOnly

# A captured group that picks how an answer is written (``/api/vms/7.json``, ``export.csv``),
# not which object it is about.
FORMATS = ("format",)


class UnknownCapture(LookupError):
    """A route captures a parameter the caller has no value for."""

    def __init__(self, regex: str, segment: str, name: str) -> None:
        super().__init__(f"route /{regex} captures `{name}` (after `{segment}/`)")
        self.segment, self.name = segment, name


def routes() -> list[tuple[str, object]]:
    """Every URL pattern as (its whole regular expression, its view)."""
    found = []

    def walk(patterns, prefix: str) -> None:
        for pattern in patterns:
            regex = pattern.pattern.regex.pattern.lstrip("^").removesuffix("\\Z").rstrip("$")
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + regex)
            else:
                found.append((prefix + regex, pattern.callback))

    walk(get_resolver().url_patterns, "")
    return found


def captures(regex: str) -> list[str]:
    """The names of the groups ``regex`` captures, in order."""
    return re.findall(r"\(\?P<(\w+)>", regex)


def operator_only(view) -> bool:
    """The operators' own commands and pages: views marked ``operator_only`` by
    ``gpucap.web.pages.operator_required``, and API views whose permission is ``IsOperator`` or
    ``IsOperatorOrReadOnly``."""
    if getattr(view, "operator_only", False):
        return True
    cls = getattr(view, "cls", None)
    if cls is None:
        return False
    permissions = getattr(view, "initkwargs", {}).get("permission_classes", cls.permission_classes)
    return any(issubclass(p, (IsOperator, IsOperatorOrReadOnly)) for p in permissions)


def fill(regex: str, ids: dict, *, default: str | None = "1") -> str | None:
    """The path of ``regex`` with each named group replaced by the id ``ids`` gives for
    (the segment before it, its name), or for its name alone; None for a pattern with a format
    suffix. A group ``ids`` has no value for gets ``default``, or raises ``UnknownCapture``
    when the default is None."""
    path, at = "", 0
    for match in re.finditer(r"\(\?P<(\w+)>", regex):
        if match.start() < at:
            continue  # a group inside one already replaced
        name, depth, end = match[1], 0, match.start()
        for end in range(match.start(), len(regex)):
            depth += {"(": 1, ")": -1}.get(regex[end], 0) if regex[end - 1] != "\\" else 0
            if depth == 0:
                break
        before = regex[at : match.start()]
        segment = before.rstrip("/").rsplit("/", 1)[-1] or path.rstrip("/").rsplit("/", 1)[-1]
        segment = segment.replace("\\", "")
        if name in FORMATS:
            return None
        value = ids.get((segment, name), ids.get(name, default))
        if value is None:
            raise UnknownCapture(regex, segment, name)
        path += before + str(value)
        at = end + 1
    path += regex[at:]
    return "/" + path.replace("\\", "")
