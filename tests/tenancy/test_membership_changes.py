"""Every membership change is audited and mailed to the member (#16): an invitation sent,
withdrawn and accepted, a role changed, a member removed, a membership set by an operator's
fleet file; and the Django admin, which would change memberships silently, only shows them."""

import re

from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.tenancy import services
from gpucap.tenancy.models import Invitation, Membership
from tests.conftest import PASSWORD

NEW_PASSWORD = "violet-kettle-orbit-42"


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def verbs_since(count: int) -> list[str]:
    return list(AuditEvent.objects.order_by("pk").values_list("verb", flat=True)[count:])


def mails_to(address: str) -> list[str]:
    return [m.subject for m in mail.outbox if m.to == [address]]


def test_each_change_of_a_membership_is_audited_and_mailed(
    member, tenant, django_capture_on_commit_callbacks
):
    admin = logged_in(member)
    nina = "nina@acme.example"
    invite_url = reverse("member-invite", kwargs={"slug": "acme"})

    # Invited: audited, mailed to the address.
    events = AuditEvent.objects.count()
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(invite_url, {"email": nina, "role": "member"})
    assert verbs_since(events) == ["invitation.send"]
    assert mails_to(nina) == ["You are invited to Acme AI on gpucap"]

    # Withdrawn: audited, and the address is told its link no longer works.
    invitation = Invitation.objects.get(email=nina)
    events = AuditEvent.objects.count()
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(reverse("invitation-revoke", kwargs={"slug": "acme", "pk": invitation.pk}))
    assert verbs_since(events) == ["invitation.revoke"]
    assert mails_to(nina)[-1] == "Your invitation to Acme AI was withdrawn"
    assert "no longer works" in mail.outbox[-1].body

    # Invited again and accepted: audited, the new member and the inviting admin mailed.
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(invite_url, {"email": nina, "role": "member"})
    link = re.search(r"http://testserver(/invitations/[^\s]+/)", mail.outbox[-1].body).group(1)
    events = AuditEvent.objects.count()
    with django_capture_on_commit_callbacks(execute=True):
        Client().post(
            link, {"username": "nina", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD}
        )
    assert verbs_since(events) == ["user.create", "membership.create", "invitation.accept"]
    assert mails_to(nina)[-1] == "You joined Acme AI"
    assert mails_to("mallory@acme.example")[-1] == "nina joined Acme AI"
    membership = Membership.objects.get(user__username="nina", tenant=tenant)

    # Role changed: audited with before and after, mailed once.
    mailed = len(mail.outbox)
    events = AuditEvent.objects.count()
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(
            reverse("member-role", kwargs={"slug": "acme", "pk": membership.pk}), {"role": "admin"}
        )
    assert verbs_since(events) == ["membership.set_role"]
    event = AuditEvent.objects.order_by("pk").last()
    assert (event.before, event.after) == ({"role": "member"}, {"role": "admin"})
    assert [(m.to, m.subject) for m in mail.outbox[mailed:]] == [
        ([nina], "Your role in Acme AI is now Admin")
    ]

    # Removed: audited, mailed.
    events = AuditEvent.objects.count()
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(reverse("member-remove", kwargs={"slug": "acme", "pk": membership.pk}))
    assert verbs_since(events) == ["membership.remove"]
    assert mails_to(nina)[-1] == "You were removed from Acme AI"
    assert not Membership.objects.filter(user__username="nina").exists()


def test_a_membership_set_by_a_fleet_file_is_mailed_to_the_member(
    operator, tenant, django_capture_on_commit_callbacks
):
    user = User.objects.create_user("pat", "pat@acme.example", PASSWORD)
    with django_capture_on_commit_callbacks(execute=True):
        services.membership_set(user=user, tenant=tenant, role="member", actor=operator)
    assert AuditEvent.objects.filter(verb="membership.create", actor=operator).exists()
    assert mails_to("pat@acme.example") == ["You are a member of Acme AI"]
    assert "olivia made you Member of Acme AI" in mail.outbox[-1].body
    with django_capture_on_commit_callbacks(execute=True):
        services.membership_set(user=user, tenant=tenant, role="member", actor=operator)
    assert len(mail.outbox) == 1, "no change, no mail"
    with django_capture_on_commit_callbacks(execute=True):
        services.membership_set(user=user, tenant=tenant, role="admin", actor=operator)
    assert mails_to("pat@acme.example")[-1] == "Your role in Acme AI is now Admin"


def test_the_django_admin_shows_memberships_but_cannot_change_them(operator, member, tenant):
    operator.is_superuser = True
    operator.save()
    client = logged_in(operator)
    membership = Membership.objects.get(user=member)
    assert client.get("/admin/tenancy/membership/").status_code == 200
    assert client.get("/admin/tenancy/membership/add/").status_code == 403
    change = client.post(
        f"/admin/tenancy/membership/{membership.pk}/change/",
        {"user": member.pk, "tenant": tenant.pk, "role": "member"},
    )
    assert change.status_code == 403
    delete = client.post(f"/admin/tenancy/membership/{membership.pk}/delete/", {"post": "yes"})
    assert delete.status_code == 403
    membership.refresh_from_db()
    assert membership.role == "admin"
