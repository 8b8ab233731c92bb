"""The image catalogue: the guest images operators offer on a cluster, by name. Tenants choose
one when they ask for a VM (``gpucap.rentals.services.vm_request`` checks the choice); the
driver builds each VM's disk as a qcow2 overlay on the image's base on the VM's node."""

import re

from django.core.exceptions import ValidationError
from django.db import transaction

from gpucap.audit.services import Actor, audit_changes, audit_record
from gpucap.fleet.models import IMAGE_NAME_PATTERN, LOGIN_USER_PATTERN, Cluster, Image, Node

# What an operator may change on an image, with the default of each on a new image.
IMAGE_FIELDS = {
    "base_image": "",
    "node_paths": {},
    "default_user": "root",
    "ports": [],
    "health_path": "/v1/models",
    "description": "",
    "enabled": True,
}
MAX_PORTS = 16
_NAME = re.compile(IMAGE_NAME_PATTERN)
_USER = re.compile(LOGIN_USER_PATTERN)
# An absolute path or a storage volume name: printable, no spaces, nothing a shell or a URI
# template would read as syntax.
_BASE = re.compile(r"^[A-Za-z0-9_./:@+-]{1,500}$")


def image_name_problem(model, *, cluster: Cluster, name: object, example: str, what: str):
    """Why ``name`` cannot name a new image of a cluster's catalogue (``model``: the VMs'
    ``Image`` or bare metal's ``BareMetalImage``, ``what`` it is called in the error), or None."""
    if not isinstance(name, str) or not _NAME.match(name):
        return (
            "must be 1-64 lowercase letters, digits, '.', '_' or '-', starting and ending with "
            f"a letter or digit (e.g. {example})"
        )
    if model.objects.filter(cluster=cluster, name=name).exists():
        return f"cluster {cluster.name} already has {what} named {name!r}"
    return None


@transaction.atomic
def image_create(*, cluster: Cluster, name: str, actor: Actor = None, **fields) -> Image:
    """Add an image to a cluster's catalogue. ``fields`` are those of ``IMAGE_FIELDS``."""
    values = {**IMAGE_FIELDS, **fields}
    errors = image_problems(cluster=cluster, values=values, unknown=set(fields) - set(IMAGE_FIELDS))
    if problem := image_name_problem(
        Image, cluster=cluster, name=name, example="ubuntu-24.04-cuda-12.6", what="an image"
    ):
        errors["name"] = problem
    if errors:
        raise ValidationError(errors)
    image = Image.objects.create(cluster=cluster, name=name, **values)
    audit_record(actor=actor, verb="image.create", target=image, after=_shown(image))
    return image


@transaction.atomic
def image_update(*, image: Image, actor: Actor = None, **fields) -> Image:
    """Change what an image is (base, per-node overrides, user, ports, health path,
    description) or whether tenants are offered it (``enabled``)."""
    image = Image.objects.select_for_update().select_related("cluster").get(pk=image.pk)
    before = _shown(image)
    values = {**{field: getattr(image, field) for field in IMAGE_FIELDS}, **fields}
    errors = image_problems(
        cluster=image.cluster, values=values, unknown=set(fields) - set(IMAGE_FIELDS)
    )
    if errors:
        raise ValidationError(errors)
    for field, value in values.items():
        setattr(image, field, value)
    after = _shown(image)
    if after == before:
        return image
    image.save()
    audit_changes(actor=actor, verb="image.update", target=image, before=before, after=after)
    return image


@transaction.atomic
def image_delete(*, image: Image, actor: Actor = None) -> None:
    """Take an image out of the catalogue. VMs that run it keep their disks and their image's
    name; to stop offering an image while its VMs live on, disable it instead."""
    image = Image.objects.select_for_update().get(pk=image.pk)
    audit_record(actor=actor, verb="image.delete", target=image, before=_shown(image))
    image.delete()


def image_problems(
    *, cluster: Cluster, values: dict, unknown: set[str] = frozenset()
) -> dict[str, str]:
    """What is wrong with an image's fields (``IMAGE_FIELDS``) on ``cluster``, by field (the
    admin's form asks too, before it saves through the services)."""
    errors = dict.fromkeys(sorted(unknown), "is not a field of an image")
    base = values["base_image"]
    if not isinstance(base, str) or not _BASE.match(base):
        errors["base_image"] = (
            "must be the base image on the nodes: an absolute path or a storage volume name "
            "(letters, digits and . _ / : @ + -, no spaces), e.g. "
            "/var/lib/gpucap/images/ubuntu-24.04-cuda-12.6.qcow2"
        )
    problem = _node_paths_problem(cluster, values["node_paths"])
    if problem:
        errors["node_paths"] = problem
    user = values["default_user"]
    if not isinstance(user, str) or not _USER.match(user):
        errors["default_user"] = (
            "must be a login user name (lowercase letters, digits, '_' or '-', starting with a "
            "letter or '_', at most 32), e.g. ubuntu"
        )
    problem = _ports_problem(values["ports"])
    if problem:
        errors["ports"] = problem
    path = values["health_path"]
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 200 or " " in path:
        errors["health_path"] = "must be an HTTP path starting with '/', e.g. /v1/models"
    if not isinstance(values["description"], str):
        errors["description"] = "must be text"
    if not isinstance(values["enabled"], bool):
        errors["enabled"] = "must be true or false"
    return errors


def _node_paths_problem(cluster: Cluster, node_paths: object) -> str:
    if not isinstance(node_paths, dict):
        return "must be a mapping of node hostnames to base images"
    bad = sorted(
        str(host)
        for host, path in node_paths.items()
        if not isinstance(path, str) or not _BASE.match(path)
    )
    if bad:
        return f"the base image for {', '.join(bad)} must be an absolute path or a volume name"
    known = set(
        Node.objects.filter(cluster=cluster, hostname__in=list(node_paths)).values_list(
            "hostname", flat=True
        )
    )
    unknown = sorted(host for host in node_paths if host not in known)
    if unknown:
        verb = "is not a node" if len(unknown) == 1 else "are not nodes"
        return f"{', '.join(unknown)} {verb} of cluster {cluster.name}"
    return ""


def _ports_problem(ports: object) -> str:
    if not isinstance(ports, list) or len(ports) > MAX_PORTS:
        return f"must be a list of at most {MAX_PORTS} TCP ports, the OpenAI endpoint first"
    if not all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports):
        return f"each port must be a whole number from 1 to 65535, got {ports!r}"
    if len(set(ports)) != len(ports):
        return "a port is listed twice"
    return ""


def _shown(image: Image) -> dict:
    return {"cluster": image.cluster.name, "name": image.name} | {
        field: getattr(image, field) for field in IMAGE_FIELDS
    }
