from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import models

from gpucap.audit.models import AuditEvent

Actor = AbstractBaseUser | AnonymousUser | None


def audit_record(
    *,
    actor: Actor,
    verb: str,
    target: models.Model,
    before: dict | None = None,
    after: dict | None = None,
    message: str = "",
) -> AuditEvent:
    """Append one audit event. Call inside the service's transaction so the event and the
    change land together or not at all."""
    user = actor if actor is not None and actor.is_authenticated else None
    return AuditEvent.objects.create(
        actor=user,
        actor_label=user.get_username() if user else "system",
        verb=verb,
        object_type=target._meta.model_name,
        object_id=str(target.pk),
        object_label=str(target)[:200],
        before=before or {},
        after=after or {},
        message=message,
    )


def audit_changes(
    *, actor: Actor, verb: str, target: models.Model, before: dict, after: dict
) -> AuditEvent | None:
    """Append one audit event holding only the fields whose shown value changed from
    ``before`` to ``after`` (None, and nothing recorded, when none did)."""
    changed = [field for field in after if after[field] != before.get(field)]
    if not changed:
        return None
    return audit_record(
        actor=actor,
        verb=verb,
        target=target,
        before={field: before.get(field) for field in changed},
        after={field: after[field] for field in changed},
    )
