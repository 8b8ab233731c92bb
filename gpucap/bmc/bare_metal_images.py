"""The bare-metal catalogue: the installer and OS images operators offer on a cluster, by name,
for tenants renting its machines whole to re-image them with (virtual media boots the image's
URL). Every change is checked first, atomic and audited."""

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction

from gpucap.audit.services import Actor, audit_changes, audit_record
from gpucap.bmc.models import BareMetalImage
from gpucap.errors import Conflict
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster
from gpucap.inputs import text_problem

# What an operator may change on an image, with the default of each on a new one.
IMAGE_FIELDS = {"image_url": "", "description": "", "enabled": True}
URL_MAX_LENGTH = 500
DESCRIPTION_MAX_LENGTH = 2000


@transaction.atomic
def bare_metal_image_create(
    *, cluster: Cluster, name: str, actor: Actor = None, **fields
) -> BareMetalImage:
    """Add an image to a cluster's bare-metal catalogue (``fields``: those of
    ``IMAGE_FIELDS``; ``image_url`` is required)."""
    values = {**IMAGE_FIELDS, **fields}
    errors = image_problems(values, unknown=set(fields) - set(IMAGE_FIELDS))
    if problem := fleet.image_name_problem(
        BareMetalImage,
        cluster=cluster,
        name=name,
        example="ubuntu-24.04-server",
        what="a bare-metal image",
    ):
        errors["name"] = problem
    if errors:
        raise ValidationError(errors)
    image = BareMetalImage.objects.create(cluster=cluster, name=name, **values)
    audit_record(actor=actor, verb="bare_metal_image.create", target=image, after=_shown(image))
    return image


@transaction.atomic
def bare_metal_image_update(
    *, image: BareMetalImage, actor: Actor = None, **fields
) -> BareMetalImage:
    """Change an image's URL or description, or whether tenants are offered it (``enabled``).
    Its cluster and name stay: rentals and their history name it."""
    image = BareMetalImage.objects.select_for_update().select_related("cluster").get(pk=image.pk)
    before = _shown(image)
    values = {**{field: getattr(image, field) for field in IMAGE_FIELDS}, **fields}
    errors = image_problems(values, unknown=set(fields) - set(IMAGE_FIELDS))
    if errors:
        raise ValidationError(errors)
    for field, value in values.items():
        setattr(image, field, value)
    after = _shown(image)
    if after == before:
        return image
    image.save()
    audit_changes(
        actor=actor, verb="bare_metal_image.update", target=image, before=before, after=after
    )
    return image


@transaction.atomic
def bare_metal_image_delete(*, image: BareMetalImage, actor: Actor = None) -> None:
    """Take an image out of the catalogue. One a rental names (it was installed through gpucap)
    stays, for the rental's history: disable it instead (409 naming the rentals)."""
    image = BareMetalImage.objects.select_for_update().select_related("cluster").get(pk=image.pk)
    used = list(image.rentals.order_by("pk").values_list("pk", flat=True)[:5])
    if used:
        named = ", ".join(str(pk) for pk in used)
        raise Conflict(
            f"bare-metal image {image.name!r} is named by rentals ({named}): disable it instead, "
            "so tenants are no longer offered it",
            code="image_in_use",
        )
    audit_record(actor=actor, verb="bare_metal_image.delete", target=image, before=_shown(image))
    image.delete()


def image_problems(values: dict, *, unknown: set[str] = frozenset()) -> dict[str, str]:
    """What is wrong with an image's fields (``IMAGE_FIELDS``), by field."""
    errors = dict.fromkeys(sorted(unknown), "is not a field of a bare-metal image")
    if problem := _url_problem(values["image_url"]):
        errors["image_url"] = problem
    description = values["description"]
    if not isinstance(description, str):
        errors["description"] = "must be text"
    elif len(description) > DESCRIPTION_MAX_LENGTH:
        errors["description"] = f"must be at most {DESCRIPTION_MAX_LENGTH} characters"
    elif problem := text_problem(description):
        errors["description"] = problem
    if not isinstance(values["enabled"], bool):
        errors["enabled"] = "must be true or false"
    return errors


def _url_problem(url: object) -> str:
    if not isinstance(url, str) or not url:
        return "is required: the http:// or https:// URL of the installer or OS image (an ISO)"
    if len(url) > URL_MAX_LENGTH:
        return f"must be at most {URL_MAX_LENGTH} characters"
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        return f"must be an http:// or https:// URL the BMC can fetch, got {url[:80]!r}"
    return ""


def _shown(image: BareMetalImage) -> dict:
    return {"cluster": image.cluster.name, "name": image.name} | {
        field: getattr(image, field) for field in IMAGE_FIELDS
    }
