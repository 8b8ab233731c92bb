"""A discovery list in YAML (``manage.py bmc_discover FILE``; docs/bmc.md): one entry per BMC.
Passwords never sit in the file: each entry names the environment variable holding its own."""

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpucap.bmc.discovery import DiscoveryEntry, DiscoveryError

_TEXT = {"min_length": 1, "max_length": 253}


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    cluster: str = Field(**_TEXT)
    address: str = Field(**_TEXT)
    username: str = Field(min_length=1, max_length=128)
    password_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    verify_tls: bool = True
    hostname: str = Field("", max_length=253)
    gpu_model: str = Field("", max_length=64)
    fabric: Literal["", "pcie", "nvswitch"] = ""
    system_id: str = Field("", pattern=r"^[A-Za-z0-9._-]{0,64}$")


def discovery_file_load(path: str | Path) -> list[DiscoveryEntry]:
    """The entries of the file, each password read from its variable. Raises
    ``DiscoveryError`` with one line per problem ("FILE: entries[1]: fabric: ...")."""
    source = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise DiscoveryError([f"{source}: cannot read the file: {error}"]) from None
    if not isinstance(raw, list) or not raw:
        raise DiscoveryError([f"{source}: must be a list of BMC entries"])
    entries, problems = [], []
    for place, item in enumerate(raw):
        where = f"entries[{place}]"
        try:
            spec = _Entry.model_validate(item)
        except ValidationError as error:
            problems.extend(f"{source}: {where}: {_said(e)}" for e in error.errors())
            continue
        password = os.environ.get(spec.password_env)
        if not password:
            problems.append(f"{source}: {where}: password_env: {spec.password_env} is not set")
            continue
        fields = spec.model_dump(exclude={"password_env"})
        entries.append(DiscoveryEntry(where=where, password=password, **fields))
    if problems:
        raise DiscoveryError(problems)
    return entries


def _said(error: dict) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "entry"
    return f"{key}: {error['msg'][0].lower()}{error['msg'][1:]}"
