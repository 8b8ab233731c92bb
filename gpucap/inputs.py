"""What every way in refuses, whatever the field: text with control characters or lone
surrogates, names with bidirectional overrides, and JSON nested deeper than anything gpucap
reads. The API's parsers, the pages' forms, the inference router and the metadata endpoint
all ask here, so the rule lives once.

Why: PostgreSQL refuses a NUL in text (a 500 after the request was accepted), a lone
surrogate cannot be encoded to UTF-8 (it failed deep in the database driver), a
right-to-left override makes a name read as another one on every page that lists it, and
JSON nested 50,000 deep overflows the parser's recursion.
"""

import json
import re

# The refused characters as regular-expression class ranges, also written into the OpenAPI
# schema as patterns (``text_pattern``). C0 controls: tab, line feed and carriage return are
# text in free text (a description, a cloud-init file); in a name nothing below U+0020 is.
_CONTROL_RANGES = r"\x00-\x08\x0b\x0c\x0e-\x1f"
_NAME_CONTROL_RANGES = r"\x00-\x1f"
_SURROGATE_RANGES = r"\ud800-\udfff"
# The embeddings and overrides (U+202A-U+202E) and the isolates (U+2066-U+2069).
_BIDI_RANGES = r"\u202a-\u202e\u2066-\u2069"

_CONTROL = re.compile(f"[{_CONTROL_RANGES}]")
_NAME_CONTROL = re.compile(f"[{_NAME_CONTROL_RANGES}]")
_SURROGATE = re.compile(f"[{_SURROGATE_RANGES}]")
_BIDI = re.compile(f"[{_BIDI_RANGES}]")

# The fields that name something (a tenant, pool, node, VM, deployment, key, label) or point
# at something by its name, in any request body or query: these refuse bidi controls too.
NAME_FIELDS = frozenset(
    {
        "name",
        "hostname",
        "slug",
        "username",
        "tenant",
        "tenants",
        "labels",
        "pool",
        "node",
        "cluster",
        "capacity_set",
        "deployment",
        "job",
        "image",
        "role",
        "model",
    }
)

MAX_JSON_DEPTH = 32


class JsonTooDeep(ValueError):
    def __init__(self, limit: int = MAX_JSON_DEPTH) -> None:
        super().__init__(f"JSON nested more than {limit} levels deep")


def text_problem(value: str, *, name: bool = False) -> str | None:
    """Why ``value`` cannot be taken as text (or as a name), or None."""
    if match := _SURROGATE.search(value):
        return f"contains U+{ord(match.group()):04X}, a lone surrogate, which is not a character"
    if match := (_NAME_CONTROL if name else _CONTROL).search(value):
        return f"contains the control character U+{ord(match.group()):04X}"
    if name and (match := _BIDI.search(value)):
        return (
            f"contains U+{ord(match.group()):04X}, a bidirectional control, "
            "which would make the name read as another"
        )
    return None


def text_pattern(*, name: bool = False) -> str:
    """``text_problem`` as a regular expression a string must match to be taken (for the
    OpenAPI schema, whose patterns are ECMA-262 and read these escapes the same way). Lone
    surrogates are left out: they are not characters, a pattern that names them is one schema
    tools fail to read, and only a JSON ``\\u`` escape can carry one."""
    refused = _NAME_CONTROL_RANGES + _BIDI_RANGES if name else _CONTROL_RANGES
    return f"^[^{refused}]*$"


def is_name_field(path: str) -> bool:
    """Whether a field path (``labels.rack``, ``tenants[0]``) is, or lies within, a name."""
    return any(part in NAME_FIELDS for part in re.split(r"[.\[\]]+", path) if part)


def data_problem(data, *, prefix: str = "") -> tuple[str, str] | None:
    """The first (field path, reason) in parsed request data: every string, dict keys
    included, against ``text_problem``, and the nesting against ``MAX_JSON_DEPTH``."""
    for path, value, depth in _walk(data, prefix):
        if depth > MAX_JSON_DEPTH:
            return path or "non_field_errors", f"nested more than {MAX_JSON_DEPTH} levels deep"
        if isinstance(value, str):
            if reason := text_problem(value, name=is_name_field(path)):
                return path or "non_field_errors", reason
        elif isinstance(value, dict):
            for key in value:
                if reason := text_problem(str(key), name=True):
                    return path or "non_field_errors", f"a key {reason}"
    return None


def json_loads(text: str | bytes, **kwargs):
    """``json.loads``, refusing a document nested deeper than ``MAX_JSON_DEPTH`` with
    ``JsonTooDeep`` (a ``ValueError``, as any other malformed JSON) instead of overflowing."""
    try:
        value = json.loads(text, **kwargs)
    except RecursionError:
        raise JsonTooDeep from None
    if any(depth > MAX_JSON_DEPTH for _, _, depth in _walk(value)):
        raise JsonTooDeep
    return value


def _walk(data, prefix: str = ""):
    """Every value in ``data`` with its field path and nesting depth, without recursion; stops
    descending below ``MAX_JSON_DEPTH`` + 1 (a caller refuses it there)."""
    stack = [(prefix, data, 0)]
    while stack:
        path, value, depth = stack.pop()
        yield path, value, depth
        if depth > MAX_JSON_DEPTH:
            continue
        if isinstance(value, dict):
            for key, sub in value.items():
                stack.append((f"{path}.{key}" if path else str(key), sub, depth + 1))
        elif isinstance(value, (list, tuple)):
            for index, sub in enumerate(value):
                stack.append((f"{path}[{index}]", sub, depth + 1))
