"""A fleet file's problems, one line each, worded for the person who wrote it.

pydantic (`schema`) finds what each key holds wrong; the rules across keys and items (`checks`)
find the rest. Every line names the item, the key and the reason, in the order of the file:
"clusters[0].nodes[3] (h100-004): gpus: must be 1..8, got 9"."""

from typing import Any, Literal, get_args, get_origin

from gpucap.fleet.fleetfile.checks import PATTERN_HINTS, Rules
from gpucap.fleet.fleetfile.words import Place, key_text, line, locate, shown, unknown_key

# Problems after which the value still counts for the rules across keys: it is text, only too
# long or with a character too many.
_KEPT = ("string_too_long", "string_pattern_mismatch")


def fleet_file_problems(
    raw: object, errors: list[dict], *, document: type, extra: list[tuple[list, str]] = ()
) -> list[str]:
    """Every problem of a parsed file, one line each, in the order of the file; empty when it
    may be applied. ``errors`` are pydantic's for ``raw`` against the ``document`` model;
    ``extra`` are (sort key, line) found elsewhere (the sets' sections, `sections`)."""
    found: list[tuple[list, str]] = list(extra)
    dropped: set[tuple] = set()
    for error in errors:
        place = locate(raw, tuple(error["loc"]), document)
        for rest, reason in _reasons(error, place):
            found.append((place.order(rest), line(place.where, rest, reason)))
        if place.rest and not _kept(error):
            dropped.add((*place.entry, place.rest[0]))
    across = Rules(raw, document, dropped, [tuple(error["loc"]) for error in errors])
    found.extend(across.found)
    # A stable sort: pydantic's problems of a key come before the rules' about it.
    return [line for _, line in sorted(found, key=lambda item: item[0])] + across.late


def _kept(error: dict) -> bool:
    value = error["input"]
    blank = isinstance(value, str) and not value.strip()
    return error["type"] in _KEPT and not blank


# --- pydantic's findings in gpucap's words ------------------------------------------------------


def _reasons(error: dict, place: Place) -> list[tuple[tuple, str]]:
    kind, value = error["type"], error["input"]
    if not place.rest:  # the item itself is no mapping: its required keys are missing too
        required = [k for k, f in place.model.model_fields.items() if f.is_required()]
        return [((), f"must be a mapping of keys to values, got {shown(value)}")] + [
            ((key,), "is required") for key in required
        ]
    key = key_text(place.rest)
    if kind == "invalid_key":  # a key that is no text (true: 1): named as YAML wrote it
        key = str(value)
        return [((key,), unknown_key(key, tuple(place.model.model_fields)))]
    if kind == "extra_forbidden":
        return [(place.rest, unknown_key(key, tuple(place.model.model_fields)))]
    return [(place.rest, _reason(kind, value, error, place.model, key))]


def _reason(kind: str, value: object, error: dict, model: type, key: str) -> str:
    if kind == "missing":
        return "is required"
    if kind == "dict_type":
        return f"must be a mapping with text keys, got {shown(value)}"
    if kind == "list_type":
        return f"must be a list (lines starting with -), got {shown(value)}"
    if kind == "int_type":
        return f"must be a whole number, got {shown(value)}"
    if kind in ("greater_than_equal", "less_than_equal"):
        low, high = _declared(model, key, "ge"), _declared(model, key, "le")
        bounds = f"{low}..{high}" if high is not None else f"at least {low}"
        return f"must be {bounds}, got {value}"
    if kind == "literal_error":
        return f"must be one of {', '.join(_choices(model, key))}; got {shown(value)}"
    if kind.startswith("string_"):
        if not isinstance(value, str) or not value.strip():
            quote = f'; quote it: {key}: "{value}"' if isinstance(value, int | float) else ""
            return f"must be text, got {shown(value)}{quote}"
        if kind == "string_too_long":
            return f"must be at most {error['ctx']['max_length']} characters, got {len(value)}"
        if kind == "string_pattern_mismatch":
            return f"{value!r} may contain only {PATTERN_HINTS[error['ctx']['pattern']]}"
    return error["msg"]  # our own validators word their problems themselves


def _hints(model: type, key: str) -> list:
    """Everything declared about a field: its types and their constraints."""
    field = model.model_fields[key]
    found, todo = list(field.metadata), [field.annotation]
    while todo:
        hint = todo.pop()
        found.append(hint)
        todo.extend(get_args(hint))
        todo.extend(getattr(hint, "metadata", ()))
    return found


def _declared(model: type, key: str, bound: str) -> Any:
    """The field's ``ge`` or ``le`` bound; None when it has none."""
    values = (getattr(hint, bound, None) for hint in _hints(model, key))
    return next((value for value in values if isinstance(value, int)), None)


def _choices(model: type, key: str) -> tuple:
    return next(get_args(h) for h in _hints(model, key) if get_origin(h) is Literal)
