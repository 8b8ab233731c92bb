"""Tenant members: admins invite an email address (a link mailed there, never shown to them;
nobody joins until the owner of the mailbox accepts), change roles and remove members, never
the last admin; other members see the list only; operators look in read-only; another tenant's
members are a 404. Pages and API."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gpucap.audit.models import AuditEvent
from gpucap.tenancy import services
from gpucap.tenancy.models import Invitation, Membership
from tests.conftest import PASSWORD

HTMX = {"HX-Request": "true"}
NEW_PASSWORD = "violet-kettle-orbit-42"


def members_url(slug: str = "acme") -> str:
    return reverse("tenant-members", kwargs={"slug": slug})


def invite_url(slug: str = "acme") -> str:
    return reverse("member-invite", kwargs={"slug": slug})


def role_url(membership, slug: str = "acme") -> str:
    return reverse("member-role", kwargs={"slug": slug, "pk": membership.pk})


def remove_url(membership, slug: str = "acme") -> str:
    return reverse("member-remove", kwargs={"slug": slug, "pk": membership.pk})


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def state() -> dict:
    """Everything a refused change must leave as it was."""
    return {
        "users": list(User.objects.order_by("pk").values_list("pk", "username", "password")),
        "members": list(
            Membership.objects.order_by("pk").values_list("pk", "user_id", "tenant_id", "role")
        ),
        "invitations": list(
            Invitation.objects.order_by("pk").values_list("pk", "email", "revoked_at")
        ),
        "events": AuditEvent.objects.count(),
    }


@pytest.fixture
def colleague(tenant) -> Membership:
    user = User.objects.create_user("mike", "mike@acme.example", PASSWORD)
    return Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.MEMBER)


@pytest.fixture
def admin_membership(member, tenant) -> Membership:
    return Membership.objects.get(user=member, tenant=tenant)


# --- the list ----------------------------------------------------------------------------------


def test_admin_sees_every_member_with_email_role_joined_last_login_and_the_forms(member, colleague):
    client = logged_in(member)
    page = client.get(members_url()).content.decode()
    assert "mallory" in page and "mallory@acme.example" in page
    assert "mike" in page and "mike@acme.example" in page
    assert colleague.created_at.strftime("%Y-%m-%d") in page
    assert "never" in page  # mike has never signed in
    assert f'action="{invite_url()}"' in page
    assert f'action="{role_url(colleague)}"' in page
    assert f'action="{remove_url(colleague)}"' in page


def test_member_sees_the_list_but_no_forms_and_posting_is_refused(member, colleague):
    client = logged_in(colleague.user)
    page = client.get(members_url()).content.decode()
    assert "mallory" in page and "mike" in page
    assert "<form" not in page.replace('<form method="post" action="/logout/">', "")
    before = state()
    assert (
        client.post(invite_url(), {"email": "x@acme.example", "role": "admin"}).status_code == 403
    )
    assert client.post(role_url(colleague), {"role": "admin"}).status_code == 403
    admin = Membership.objects.get(user=member)
    assert client.post(remove_url(admin)).status_code == 403
    assert state() == before


def test_another_tenants_members_pages_are_404(other_member, member, colleague, other_tenant):
    client = logged_in(other_member)
    before = state()
    assert client.get(members_url("acme")).status_code == 404
    assert (
        client.post(invite_url("acme"), {"email": "x@y.example", "role": "member"}).status_code
        == 404
    )
    assert client.post(role_url(colleague), {"role": "admin"}).status_code == 404
    assert client.post(remove_url(colleague)).status_code == 404
    assert state() == before


def test_a_membership_id_of_another_tenant_is_404_for_an_admin(member, other_member, other_tenant):
    globex = Membership.objects.get(user=other_member)
    client = logged_in(member)
    before = state()
    # acme's admin names globex's membership under acme's URL.
    assert client.post(role_url(globex, "acme"), {"role": "admin"}).status_code == 404
    assert client.post(remove_url(globex, "acme")).status_code == 404
    assert state() == before


def test_operator_sees_members_read_only_and_their_posts_are_refused(operator, member, colleague):
    client = logged_in(operator)
    response = client.get(members_url())
    page = response.content.decode()
    assert response.status_code == 200
    assert "Viewing Acme AI as operator (read-only)." in page
    assert "mallory" in page and "mike" in page
    assert page.count("<form") == 1  # sign out only
    before = state()
    assert (
        client.post(invite_url(), {"email": "x@acme.example", "role": "member"}).status_code == 403
    )
    assert client.post(role_url(colleague), {"role": "admin"}).status_code == 403
    assert client.post(remove_url(colleague)).status_code == 403
    assert state() == before


def test_member_list_runs_a_fixed_number_of_queries(member, tenant, django_assert_num_queries):
    client = logged_in(member)
    # session, user, tenant ids; tenant; role; members; invitations.
    with django_assert_num_queries(7):
        client.get(members_url())
    for n in range(5):
        user = User.objects.create_user(f"user{n}", f"user{n}@acme.example")
        Membership.objects.create(user=user, tenant=tenant)
        services.invitation_send(
            tenant=tenant, email=f"new{n}@acme.example", role="member", site_url="http://x"
        )
    with django_assert_num_queries(7):
        response = client.get(members_url())
    assert len(response.context["members"]) == 6


# --- inviting ---------------------------------------------------------------------------------


def mailed_link() -> str:
    """The invitation link of the last mail."""
    return re.search(r"http://testserver(/invitations/[^\s]+/)", mail.outbox[-1].body).group(1)


def invite(client, email, role="member", slug="acme", **kwargs):
    return client.post(invite_url(slug), {"email": email, "role": role}, **kwargs)


def test_invite_mails_a_link_and_makes_nobody_a_member_until_it_is_accepted(
    member, tenant, django_capture_on_commit_callbacks
):
    client = logged_in(member)
    with django_capture_on_commit_callbacks(execute=True):
        response = invite(client, "Nina.K@acme.example", headers=HTMX)
    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<div class="columns" id="members-panel">')
    assert "Invitation mailed to <strong>Nina.K@acme.example</strong> as Member" in page
    assert "Nina.K@acme.example" in page.split('id="invitations"')[1]  # listed as waiting
    assert not User.objects.filter(email__iexact="nina.k@acme.example").exists()
    (message,) = mail.outbox
    assert message.to == ["Nina.K@acme.example"] and "Acme AI" in message.subject
    link = mailed_link()
    assert link not in page  # the link is the mailbox owner's alone
    assert list(
        AuditEvent.objects.filter(actor=member).order_by("pk").values_list("verb", flat=True)
    ) == ["invitation.send"]

    # Nina opens the link, makes an account (her username, her password) and lands in acme.
    nina = Client()
    form = nina.get(link)
    assert form.status_code == 200 and "Join Acme AI" in form.content.decode()
    assert "no-store" in form["Cache-Control"]
    with django_capture_on_commit_callbacks(execute=True):
        joined = nina.post(
            link,
            {"username": "nina", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD},
            follow=True,
        )
    assert joined.redirect_chain[-1][0] == reverse("tenant-detail", kwargs={"slug": "acme"})
    user = User.objects.get(username="nina")
    assert user.email == "Nina.K@acme.example"
    assert Membership.objects.get(user=user, tenant=tenant).role == "member"
    assert Client().login(username="nina", password=NEW_PASSWORD)
    # The inviting admin is told, and so is the new member.
    told = {message.to[0]: message.subject for message in mail.outbox[1:]}
    assert told == {"mallory@acme.example": "nina joined Acme AI", user.email: "You joined Acme AI"}

    # The link has done its job: it no longer works, for anyone.
    again = Client().get(link)
    assert again.status_code == 410
    assert "This invitation no longer works" in again.content.decode()
    assert "password1" not in again.content.decode()


def test_another_tenants_admin_who_owns_an_account_cannot_reach_this_tenant_through_it(
    member, tenant, other_tenant, other_member, django_capture_on_commit_callbacks
):
    """The takeover: globex's admin once made an account for zoe@example.com and knows its
    password. When acme's admin invites that address, the account does not join acme: only
    whoever reads zoe's mail can accept, and the answer says nothing of the account."""
    Membership.objects.filter(user=other_member).update(role="admin")
    controlled = User.objects.create_user("zoe", "zoe@example.com", "globex-knows-this-1")
    Membership.objects.create(user=controlled, tenant=other_tenant)
    Membership.objects.filter(user=controlled).delete()  # removed from globex again

    with django_capture_on_commit_callbacks(execute=True):
        response = invite(logged_in(member), "zoe@example.com")
    assert response.status_code == 200
    page = response.content.decode()
    assert "zoe@example.com" in page and ">zoe<" not in page and "had an account" not in page

    attacker = Client()
    assert attacker.login(username="zoe", password="globex-knows-this-1")
    assert attacker.get(reverse("tenant-detail", kwargs={"slug": "acme"})).status_code == 404
    assert not Membership.objects.filter(user=controlled, tenant=tenant).exists()
    assert logged_in(other_member).get(members_url("acme")).status_code == 404
    # Only the mailbox got the link.
    assert [m.to for m in mail.outbox] == [["zoe@example.com"]]


def test_the_answer_is_the_same_whether_the_address_has_an_account_or_not(
    member, other_member, django_capture_on_commit_callbacks
):
    def answer(email):
        response = invite(logged_in(member), email, headers=HTMX)
        alert = re.search(
            r'<div [^>]*id="invitation-sent">.*?</div>', response.content.decode(), re.S
        )
        return response.status_code, alert.group(0).replace(email, "X")

    mail_to_new = answer("new-person@globex.example")
    mail_to_existing = answer("oscar@globex.example")
    assert mail_to_new == mail_to_existing
    assert not Membership.objects.filter(user=other_member, tenant__slug="acme").exists()


def test_someone_with_an_account_signs_in_and_accepts_as_that_account(
    member, other_member, tenant, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        invite(logged_in(member), "oscar@globex.example", role="admin")
    link = mailed_link()

    anonymous = Client().get(link).content.decode()
    assert f"{reverse('login')}?next={link.replace('/', '%2F')}" in anonymous

    oscar = logged_in(other_member)
    page = oscar.get(link).content.decode()
    assert "Join as oscar" in page and "password1" not in page
    with django_capture_on_commit_callbacks(execute=True):
        response = oscar.post(link)
    assert response.status_code == 302
    assert Membership.objects.get(user=other_member, tenant=tenant).role == "admin"
    assert oscar.get(reverse("tenant-detail", kwargs={"slug": "acme"})).status_code == 200
    assert oscar.post(link).status_code == 410  # once


def test_a_bad_new_account_is_refused_next_to_its_fields_and_makes_nothing(
    member, colleague, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        invite(logged_in(member), "nina@acme.example")
    link = mailed_link()
    before = state()
    cases = [
        ({"username": "mike", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD}, "taken"),
        ({"username": "nina", "password1": "password", "password2": "password"}, "too common"),
        ({"username": "nina", "password1": NEW_PASSWORD, "password2": "other"}, "differ"),
        ({"username": "", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD}, "required"),
    ]
    for fields, reason in cases:
        response = Client().post(link, fields)
        assert response.status_code == 400, fields
        assert reason in response.content.decode(), (fields, response.content.decode())
        assert 'class="field-error"' in response.content.decode()
    assert state() == before
    assert Client().get(link).status_code == 200  # still usable


def test_a_withdrawn_an_expired_and_a_replaced_link_no_longer_work(
    member, tenant, settings, django_capture_on_commit_callbacks
):
    client = logged_in(member)
    with django_capture_on_commit_callbacks(execute=True):
        invite(client, "nina@acme.example")
    first = mailed_link()
    with django_capture_on_commit_callbacks(execute=True):
        invite(client, "NINA@acme.example", role="admin")  # again: replaces the first
    second = mailed_link()
    assert Client().get(first).status_code == 410
    assert Client().get(second).status_code == 200

    invitation = Invitation.objects.get(accepted_at=None, revoked_at=None)
    response = client.post(
        reverse("invitation-revoke", kwargs={"slug": "acme", "pk": invitation.pk}), headers=HTMX
    )
    assert "Withdrew the invitation of NINA@acme.example." in response.content.decode()
    assert Client().get(second).status_code == 410
    posted = Client().post(
        second, {"username": "nina", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD}
    )
    assert posted.status_code == 410 and not User.objects.filter(username="nina").exists()

    with django_capture_on_commit_callbacks(execute=True):
        invite(client, "late@acme.example")
    late = mailed_link()
    Invitation.objects.filter(email="late@acme.example").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert Client().get(late).status_code == 410
    assert "expired" in client.get(members_url()).content.decode()
    assert Client().get("/invitations/not-a-token-anyone-issued/").status_code == 410


def test_a_bad_email_is_refused_next_to_the_field_and_nothing_changes(member):
    client = logged_in(member)
    before = state()
    response = invite(client, "not-an-address", headers=HTMX)
    page = response.content.decode()
    assert response.status_code == 400
    assert '<p class="field-error" id="id_email-error">Enter a valid email address.</p>' in page
    assert 'value="not-an-address"' in page
    assert state() == before
    assert mail.outbox == []


def test_inviting_someone_who_is_a_member_already_names_the_email_field(member, colleague):
    before = state()
    response = invite(logged_in(member), "mike@acme.example", role="admin")
    assert response.status_code == 400
    assert "mike@acme.example is already a member of Acme AI" in response.content.decode()
    assert 'id="id_email-error"' in response.content.decode()
    assert state() == before


def test_an_unknown_role_is_refused_by_the_service(member, tenant):
    with pytest.raises(Exception) as refused:
        services.invitation_send(
            tenant=tenant, email="x@acme.example", role="owner", site_url="http://x"
        )
    assert refused.value.message_dict == {"role": ["unknown role 'owner'; choose admin or member"]}


def test_another_tenants_invitation_cannot_be_withdrawn_through_this_tenant(member, other_tenant):
    theirs = services.invitation_send(
        tenant=other_tenant, email="x@globex.example", role="member", site_url="http://x"
    )
    url = reverse("invitation-revoke", kwargs={"slug": "acme", "pk": theirs.pk})
    assert logged_in(member).post(url).status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


def test_forgot_password_mails_a_reset_link_to_the_accounts_own_address(
    member, django_capture_on_commit_callbacks
):
    page = Client().get(reverse("login")).content.decode()
    assert reverse("password-reset") in page
    response = Client().post(reverse("password-reset"), {"email": "MALLORY@acme.example"})
    assert response.status_code == 302
    (message,) = mail.outbox
    assert message.to == ["mallory@acme.example"]
    link = re.search(r"http://testserver(/accounts/set-password/[^\s]+)", message.body).group(1)
    # Unknown addresses get the same answer and no mail.
    assert Client().post(reverse("password-reset"), {"email": "who@x.example"}).status_code == 302
    assert len(mail.outbox) == 1
    client = Client()
    form = client.get(link, follow=True)
    client.post(
        form.redirect_chain[-1][0],
        {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert Client().login(username="mallory", password=NEW_PASSWORD)


# --- roles and removal ------------------------------------------------------------------------


def test_admin_promotes_and_demotes_a_member(member, colleague, django_capture_on_commit_callbacks):
    client = logged_in(member)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(role_url(colleague), {"role": "admin"}, headers=HTMX)
    assert response.status_code == 200
    assert "mike is now Admin." in response.content.decode()
    colleague.refresh_from_db()
    assert colleague.role == "admin"
    event = AuditEvent.objects.get(verb="membership.set_role")
    assert (event.actor, event.before, event.after) == (
        member,
        {"role": "member"},
        {"role": "admin"},
    )
    (message,) = mail.outbox  # the member is told
    assert message.to == ["mike@acme.example"]
    assert message.subject == "Your role in Acme AI is now Admin"


def test_the_last_admin_cannot_step_down_or_be_removed(member, admin_membership, colleague):
    client = logged_in(member)
    before = state()
    response = client.post(role_url(admin_membership), {"role": "member"}, headers=HTMX)
    assert response.status_code == 400
    assert "mallory is the last admin of Acme AI" in response.content.decode()
    response = client.post(remove_url(admin_membership), headers=HTMX)
    assert response.status_code == 400
    assert "Not changed: mallory is the last admin of Acme AI" in response.content.decode()
    assert state() == before


def test_an_admin_may_leave_once_another_admin_exists(member, admin_membership, colleague):
    services.member_set_role(membership=colleague, role="admin")
    response = logged_in(member).post(remove_url(admin_membership), headers=HTMX)
    assert response.status_code == 200
    assert "Removed mallory from Acme AI." in response.content.decode()
    assert not Membership.objects.filter(pk=admin_membership.pk).exists()
    assert "<form" not in response.content.decode()  # no longer an admin here


def test_admin_removes_a_member_who_then_loses_the_tenant(
    member, colleague, django_capture_on_commit_callbacks
):
    client = logged_in(member)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(remove_url(colleague))
    assert response.status_code == 302
    assert not Membership.objects.filter(pk=colleague.pk).exists()
    assert User.objects.filter(username="mike").exists()  # the account stays
    assert [(m.to, m.subject) for m in mail.outbox] == [
        (["mike@acme.example"], "You were removed from Acme AI")
    ]
    assert AuditEvent.objects.get(verb="membership.remove").before == {
        "role": "member",
        "user": "mike",
    }
    assert (
        logged_in(colleague.user).get(reverse("tenant-detail", kwargs={"slug": "acme"})).status_code
        == 404
    )


# --- the API ----------------------------------------------------------------------------------


def members_api(tenant) -> str:
    return f"/api/tenants/{tenant.pk}/members/"


def test_api_lists_members_to_members_and_operators(member_api, operator_api, colleague, tenant):
    for client in (member_api, operator_api):
        response = client.get(members_api(tenant))
        assert response.status_code == 200
        assert [(m["username"], m["role"]) for m in response.data] == [
            ("mallory", "admin"),
            ("mike", "member"),
        ]


def invitations_api(tenant) -> str:
    return f"/api/tenants/{tenant.pk}/invitations/"


def test_api_invite_answers_the_invitation_never_its_link(
    member_api, tenant, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = member_api.post(
            invitations_api(tenant), {"email": "nina@acme.example", "role": "admin"}, format="json"
        )
    assert response.status_code == 201
    assert {k: response.data[k] for k in ("email", "role", "invited_by")} == {
        "email": "nina@acme.example",
        "role": "admin",
        "invited_by": "mallory",
    }
    token = re.search(r"/invitations/([^/\s]+)/", mail.outbox[0].body).group(1)
    assert token not in str(response.data)
    listed = member_api.get(invitations_api(tenant)).data
    assert [i["email"] for i in listed] == ["nina@acme.example"]
    assert member_api.delete(f"{invitations_api(tenant)}{listed[0]['id']}/").status_code == 204
    assert member_api.get(invitations_api(tenant)).data == []
    assert not Membership.objects.filter(user__email="nina@acme.example").exists()


def test_api_members_no_longer_takes_a_post(member_api, tenant):
    before = state()
    response = member_api.post(members_api(tenant), {"email": "x@acme.example"}, format="json")
    assert response.status_code == 405
    assert state() == before


def test_api_bad_email_is_400_naming_the_field(member_api, tenant):
    before = state()
    response = member_api.post(invitations_api(tenant), {"email": "nope"}, format="json")
    assert response.status_code == 400
    assert response.data["error"]["fields"] == {"email": ["Enter a valid email address."]}
    assert state() == before


def test_api_writes_by_operators_and_plain_members_are_403(operator_api, colleague, tenant):
    from rest_framework.test import APIClient

    plain = APIClient()
    plain.force_authenticate(colleague.user)
    before = state()
    for client in (operator_api, plain):
        assert (
            client.post(
                invitations_api(tenant), {"email": "x@acme.example"}, format="json"
            ).status_code
            == 403
        )
        assert client.get(invitations_api(tenant)).status_code == 403
        url = f"{members_api(tenant)}{colleague.pk}/"
        assert client.patch(url, {"role": "admin"}, format="json").status_code == 403
        assert client.delete(url).status_code == 403
    assert state() == before


def test_api_another_tenants_members_are_404(
    other_member_api, member, colleague, tenant, other_member, member_api
):
    assert other_member_api.get(members_api(tenant)).status_code == 404
    assert (
        other_member_api.post(
            invitations_api(tenant), {"email": "x@y.example"}, format="json"
        ).status_code
        == 404
    )
    globex = Membership.objects.get(user=other_member)
    # An acme admin naming globex's membership under acme.
    assert member_api.delete(f"{members_api(tenant)}{globex.pk}/").status_code == 404


def test_api_changes_a_role_and_removes_a_member_but_never_the_last_admin(
    member_api, admin_membership, colleague, tenant
):
    url = f"{members_api(tenant)}{colleague.pk}/"
    response = member_api.patch(url, {"role": "admin"}, format="json")
    assert response.status_code == 200 and response.data["role"] == "admin"
    assert member_api.delete(url).status_code == 204
    last = member_api.delete(f"{members_api(tenant)}{admin_membership.pk}/")
    assert last.status_code == 400
    assert "last admin" in last.data["error"]["message"]
    assert Membership.objects.filter(pk=admin_membership.pk).exists()
