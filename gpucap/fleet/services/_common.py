"""What the services of every fleet entity share: the capacity set's generation that a change
bumps, a one-field change, the set's row lock, and deleting a row nothing uses any more."""

from django.db import transaction
from django.db.models import F, ProtectedError, RestrictedError
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.errors import Conflict
from gpucap.fleet.models import CapacitySet
from gpucap.fleet.signals import capacity_set_changed


def capacity_set_bump(*, capacity_set_id: int | None) -> None:
    """Record that something a plan depends on changed (the set's generation) and say so
    (``capacity_set_changed``: plans asks for a prompt replan once the change commits). A no-op
    for standalone nodes/pools."""
    if capacity_set_id is None:
        return
    CapacitySet.objects.filter(pk=capacity_set_id).update(
        generation=F("generation") + 1, updated_at=timezone.now()
    )
    capacity_set_changed.send(sender=CapacitySet, capacity_set_id=capacity_set_id)


def field_change(obj, field: str, value, *, verb: str, actor: Actor, capacity_set_id=None):
    """Set one field of a locked row, bump the set's generation when the change can alter a
    plan (``capacity_set_id`` given) and audit it. Setting the value it already has is a no-op."""
    before = getattr(obj, field)
    if before == value:
        return obj
    setattr(obj, field, value)
    extra = ["updated_at"] if any(f.name == "updated_at" for f in obj._meta.fields) else []
    obj.save(update_fields=[field, *extra])
    capacity_set_bump(capacity_set_id=capacity_set_id)
    audit_record(actor=actor, verb=verb, target=obj, before={field: before}, after={field: value})
    return obj


def lock_set(capacity_set: CapacitySet) -> None:
    """Serialise changes to one set's pools (ranks, floors) behind its row lock."""
    CapacitySet.objects.select_for_update().filter(pk=capacity_set.pk).first()


def delete_unused(obj, *, what: str, verb: str, before: dict, actor: Actor) -> None:
    """Delete ``obj`` unless rows still point at it through a PROTECT foreign key; then say
    which rows, so the operator knows what to remove first."""
    audit_record(actor=actor, verb=verb, target=obj, before=before)
    try:
        with transaction.atomic():
            obj.delete()
    except ProtectedError as exc:
        raise Conflict(
            f"{what} is still used by {_describe_rows(exc.protected_objects)}; remove those first",
            code="in_use",
        ) from None
    except RestrictedError as exc:
        raise Conflict(
            f"{what} is still used by {_describe_rows(exc.restricted_objects)}; remove those first",
            code="in_use",
        ) from None


def _describe_rows(rows) -> str:
    """'2 capacity sets (h100-east, l40s-east) and 1 node (a100-001)'."""
    names: dict[str, list[str]] = {}
    plural: dict[str, str] = {}
    for row in rows:
        singular = str(row._meta.verbose_name)
        plural[singular] = str(row._meta.verbose_name_plural)
        names.setdefault(singular, []).append(str(row))
    parts = []
    for singular in sorted(names):
        listed = sorted(names[singular])
        shown = ", ".join(listed[:5]) + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")
        noun = singular if len(listed) == 1 else plural[singular]
        parts.append(f"{len(listed)} {noun} ({shown})")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
