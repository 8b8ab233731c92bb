"""The NoCloud seed a real guest boots with (issue 14, part 1; DESIGN.md section 10).

Cloud images run cloud-init, whose NoCloud datasource reads three files from a read-only disk
labelled ``cidata``: ``meta-data`` (instance id and hostname), ``user-data`` (here: the tenant's
SSH key, then the tenant's own user-data if any) and ``network-config`` (version 2, the address
gpucap gave the VM). This module builds those files and the ISO 9660 image that carries them,
with pycdlib (pure Python: no genisoimage on the node, no temporary files).

``user-data`` is a MIME multipart: gpucap's ``#cloud-config`` part with the SSH key first, the
tenant's part second, so cloud-init merges them and the tenant's own configuration can neither
drop the key nor be rewritten by gpucap. The tenant's part is checked before anything is built
(``user_data_problem``): at most ``USER_DATA_LIMIT`` bytes of UTF-8 text (EC2's limit), no NUL,
and a ``#cloud-config`` part must be a YAML mapping.
"""

import hashlib
import io
import ipaddress
import json
from dataclasses import dataclass
from email.charset import Charset
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

import pycdlib
import yaml

from gpucap.drivers.base import GuestNetwork

VOLUME_LABEL = "cidata"
USER_DATA_LIMIT = 16 * 1024  # bytes, as EC2 allows


@dataclass(frozen=True)
class Seed:
    instance_id: str  # "vm-42", as the metadata endpoint names it
    hostname: str
    ssh_public_key: str
    user_data: str = ""  # the tenant's own, optional
    network: GuestNetwork | None = None


class SeedError(ValueError):
    """What the tenant gave cannot go into a seed; the message names the field and why."""


def user_data_problem(user_data: str) -> str:
    """Why a tenant's user-data cannot be used ("" when it can)."""
    if "\x00" in user_data:
        return "must be text without NUL characters"
    size = len(user_data.encode("utf-8"))
    if size > USER_DATA_LIMIT:
        return f"is {size:,} bytes; at most {USER_DATA_LIMIT:,} are allowed"
    if user_data.startswith("#cloud-config"):
        try:
            parsed = yaml.safe_load(user_data)
        except yaml.YAMLError as exc:
            return f"is #cloud-config but not valid YAML: {' '.join(str(exc).split())}"
        if parsed is not None and not isinstance(parsed, dict):
            return "is #cloud-config but not a YAML mapping of keys"
    return ""


def seed_files(seed: Seed) -> dict[str, bytes]:
    """The three files of the seed, by name."""
    problem = user_data_problem(seed.user_data)
    if problem:
        raise SeedError(f"user_data: {problem}")
    files = {
        "meta-data": _yaml({"instance-id": seed.instance_id, "local-hostname": seed.hostname}),
        "user-data": _user_data(seed),
    }
    if seed.network is not None:
        files["network-config"] = _yaml(_network_config(seed.network))
    return files


def seed_iso(seed: Seed) -> bytes:
    """The seed as an ISO 9660 image (Joliet and Rock Ridge names, volume label ``cidata``), to
    attach to the guest as a read-only CD-ROM."""
    files = seed_files(seed)
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=VOLUME_LABEL)
    for number, (name, content) in enumerate(sorted(files.items()), start=1):
        iso.add_fp(
            io.BytesIO(content),
            len(content),
            f"/FILE{number}.;1",
            rr_name=name,
            joliet_path=f"/{name}",
        )
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def _user_data(seed: Seed) -> bytes:
    key = seed.ssh_public_key.strip()
    config = "#cloud-config\n" + _yaml({"ssh_authorized_keys": [key]}).decode()
    if not seed.user_data:
        return config.encode()
    # A boundary from the content: the same seed is the same bytes, whoever builds it.
    digest = hashlib.sha256(f"{config}\0{seed.user_data}".encode()).hexdigest()[:32]
    message = MIMEMultipart(boundary=f"gpucap-{digest}")
    message.attach(MIMEText(config, "cloud-config", _EIGHT_BIT))
    message.attach(_tenant_part(seed.user_data))
    return message.as_bytes()


def _tenant_part(user_data: str) -> MIMEText:
    """The tenant's user-data as cloud-init expects a part: a ``#cloud-config``, a script or any
    other format is marked by its first line."""
    subtype = {
        "#cloud-config": "cloud-config",
        "#!": "x-shellscript",
        "#include": "x-include-url",
        "#cloud-boothook": "cloud-boothook",
    }
    first = next((kind for prefix, kind in subtype.items() if user_data.startswith(prefix)), "")
    return MIMEText(user_data, first or "plain", _EIGHT_BIT)


# Parts as written, not base64: what an operator reads on the seed is what the tenant gave.
_EIGHT_BIT = Charset("utf-8")
_EIGHT_BIT.body_encoding = None


def _network_config(network: GuestNetwork) -> dict:
    interface = ipaddress.ip_interface(network.address)
    ethernet: dict = {
        "match": {"macaddress": network.mac.lower()},
        "set-name": "eth0",
        "addresses": [str(interface)],
    }
    if network.gateway:
        key = "gateway4" if interface.version == 4 else "gateway6"
        ethernet[key] = network.gateway
    if network.nameservers:
        ethernet["nameservers"] = {"addresses": list(network.nameservers)}
    return {"version": 2, "ethernets": {"eth0": ethernet}}


def _yaml(document: dict) -> bytes:
    # JSON is YAML, and it quotes every string: a hostname like "no" or "0755" stays a string.
    return (json.dumps(document, indent=2) + "\n").encode()
