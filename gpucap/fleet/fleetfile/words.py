"""How a fleet file names places and values in its problems and changes, shared by the schema
and the diff."""

import difflib
import json
from dataclasses import dataclass
from typing import get_args, get_origin


def shown(value: object) -> str:
    """A value as a problem quotes it: YAML's words for nothing, booleans and collections."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def unknown_key(key: str, keys: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, keys, n=1)
    if close:
        return f"unknown key; did you mean {close[0]}?"
    return f"unknown key; expected one of {', '.join(keys)}"


def group_text(cluster: str, capacity_set: str | None) -> str:
    """The pools whose ranks are unique together."""
    if capacity_set is None:
        return f"the standalone pools of cluster {cluster}"
    return f"the pools of capacity set {capacity_set}"


def fixed_field(field: str, name: str, value: object, wanted: object, noun: str) -> str:
    return (
        f"{field}: cannot change in place ({noun} {name} has {value}, the file says {wanted}); "
        f"declare a new {noun} instead"
    )


def compact(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": ")) if value else "(none)"


def table_text(partitions: list | None) -> str:
    return f"a {len(partitions)}-partition table" if partitions else "the default table"


# --- where a problem is -------------------------------------------------------------------------


@dataclass
class Place:
    entry: tuple  # the loc of the item
    where: str
    model: type
    rest: tuple  # the key (and list indices) within the item
    position: list  # where the item sits in the file

    def order(self, rest: tuple, slot: str | None = None) -> list:
        """Sort key of a problem about ``rest``: the item's place, then the item's
        ``report_order`` (a key, or a ``slot`` for a rule reported apart from its key). An
        item that is no mapping, then unknown keys, come first, as a reader meets them."""
        if not rest:
            return [*self.position, -2]
        if rest[0] not in self.model.model_fields:
            return [*self.position, -1]
        tail = [x for x in rest[1:] if isinstance(x, int)]
        slots = _slots(self.model)
        return [*self.position, slots.index(slot if slot in slots else rest[0]), *tail]


def where_of(raw: object, loc: tuple, *, document: type) -> str:
    """The label of the item at ``loc``: "clusters[0].nodes[3] (h100-004)"."""
    return locate(raw, loc, document).where


def locate(raw: object, loc: tuple, document: type) -> Place:
    model, path, where, position = document, "", "", []
    i = 0
    while i + 1 < len(loc) and isinstance(loc[i], str) and isinstance(loc[i + 1], int):
        item_model = _item_model(model, loc[i])
        if item_model is None:
            break
        key, index = loc[i], loc[i + 1]
        items = raw.get(key) if isinstance(raw, dict) else None
        raw = items[index] if isinstance(items, list) and index < len(items) else None
        position += [_slots(model).index(key), index]
        path = f"{path}.{key}[{index}]" if path else f"{key}[{index}]"
        if key == "gpu_list":  # a node's cards are named after the node
            where = f"{where}: gpu_list[{index}]"
        else:
            where = _label(path, raw, item_model.label_key)
            if key == "nodes" and isinstance(raw, dict) and "count" in raw:
                where = f"{where[:-1]}, count {raw['count']})" if where.endswith(")") else where
        model = item_model
        i += 2
    return Place(
        entry=tuple(loc[:i]), where=where, model=model, rest=tuple(loc[i:]), position=position
    )


def _slots(model: type) -> list[str]:
    return list(model.report_order or model.model_fields)


def _item_model(model: type, key: str) -> type | None:
    field = model.model_fields.get(key)
    if field is None or get_origin(field.annotation) is not list:
        return None
    (item,) = get_args(field.annotation)
    return item if isinstance(item, type) and hasattr(item, "label_key") else None


def _label(path: str, raw: object, name_key: str | None) -> str:
    name = raw.get(name_key) if isinstance(raw, dict) and name_key else None
    return f"{path} ({name})" if isinstance(name, str | int) and name != "" else path


def key_text(rest: tuple) -> str:
    return str(rest[0]) + "".join(f"[{x}]" for x in rest[1:])


def line(where: str, rest: tuple, reason: str) -> str:
    text = f"{key_text(rest)}: {reason}" if rest else reason
    return f"{where}: {text}" if where else text
