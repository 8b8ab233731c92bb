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

# C0 controls. Tab, line feed and carriage return are text in free text (a description, a
# cloud-init file); in a name nothing below U+0020 is.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_NAME_CONTROL = re.compile(r"[\x00-\x1f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# The embeddings and overrides (U+202A-U+202E) and the isolates (U+2066-U+2069).
_BIDI = re.compile(r"[\u202a-\u202e\u2066-\u2069]")

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


def is_name_field(path: str) -> bool:
    """Whether a field path (``labels.rack``, ``tenants[0]``) is, or lies within, a name."""
    return any(part in NAME_FIELDS for part in re.split(r"[.\[\]]+", path) if part)


def data_problem(data, *, prefix: str = "") -> tuple[str, str] | None:
    """The first (field path, reason) in parsed request data, walked without recursion: every
    string, dict keys included, against ``text_problem``, and the nesting against
    ``MAX_JSON_DEPTH``."""
    stack = [(prefix, data, 0)]
    while stack:
        path, value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return path or "non_field_errors", f"nested more than {MAX_JSON_DEPTH} levels deep"
        if isinstance(value, str):
            if reason := text_problem(value, name=is_name_field(path)):
                return path or "non_field_errors", reason
        elif isinstance(value, dict):
            for key, sub in value.items():
                key_text = str(key)
                sub_path = f"{path}.{key_text}" if path else key_text
                if reason := text_problem(key_text, name=True):
                    return path or "non_field_errors", f"a key {reason}"
                stack.append((sub_path, sub, depth + 1))
        elif isinstance(value, (list, tuple)):
            for index, sub in enumerate(value):
                stack.append((f"{path}[{index}]", sub, depth + 1))
    return None


def json_loads(text: str | bytes, **kwargs):
    """``json.loads``, refusing a document nested deeper than ``MAX_JSON_DEPTH`` with
    ``JsonTooDeep`` (a ``ValueError``, as any other malformed JSON) instead of overflowing."""
    try:
        value = json.loads(text, **kwargs)
    except RecursionError:
        raise JsonTooDeep from None
    if _depth_over(value, MAX_JSON_DEPTH):
        raise JsonTooDeep
    return value


def _depth_over(value, limit: int) -> bool:
    stack = [(value, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(value, dict):
            stack.extend((sub, depth + 1) for sub in value.values())
        elif isinstance(value, list):
            stack.extend((sub, depth + 1) for sub in value)
    return False
