"""Tenant members: admins invite by email address (an account with a set-password link that
works once), change roles and remove members, never the last admin; other members see the list
only; operators look in read-only; another tenant's members are a 404. Pages and API."""

import logging
import re

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.tenancy import services
from gpucap.tenancy.models import Membership
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
    # session, user, tenant ids; tenant; role; members.
    with django_assert_num_queries(6):
        client.get(members_url())
    for n in range(5):
        user = User.objects.create_user(f"user{n}", f"user{n}@acme.example")
        Membership.objects.create(user=user, tenant=tenant)
    with django_assert_num_queries(6):
        response = client.get(members_url())
    assert len(response.context["members"]) == 6


# --- inviting ---------------------------------------------------------------------------------


def test_invite_makes_an_account_and_a_set_password_link_that_works_once(
    member, tenant, caplog, django_capture_on_commit_callbacks
):
    client = logged_in(member)
    with (
        caplog.at_level(logging.INFO, logger="gpucap.tenancy.services"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = client.post(
            invite_url(), {"email": "Nina.K@acme.example", "role": "member"}, headers=HTMX
        )
    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<div class="columns" id="members-panel">')
    assert "no-store" in response["Cache-Control"]
    nina = User.objects.get(email="Nina.K@acme.example")
    assert nina.username == "Nina.K" and not nina.has_usable_password()
    assert Membership.objects.get(user=nina, tenant=tenant).role == "member"
    link = re.search(r'<code class="secret" id="set-password-link">([^<]+)</code>', page).group(1)
    assert link.startswith("http://testserver/accounts/set-password/")
    # Mailed and logged too.
    (message,) = mail.outbox
    assert message.to == ["Nina.K@acme.example"] and link in message.body
    assert "Acme AI" in message.subject
    assert any(link in record.getMessage() for record in caplog.records)
    assert list(
        AuditEvent.objects.filter(actor=member).order_by("pk").values_list("verb", flat=True)
    ) == ["user.create", "membership.invite"]

    # Nina opens the link, chooses a password and signs in with it.
    nina_client = Client()
    form = nina_client.get(link, follow=True)
    assert "Choose a password" in form.content.decode()
    done = nina_client.post(
        form.redirect_chain[-1][0],
        {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
        follow=True,
    )
    assert done.redirect_chain[-1][0] == reverse("set-password-done")
    assert "Password set" in done.content.decode()
    assert Client().login(username="Nina.K", password=NEW_PASSWORD)
    signed_in = Client()
    landing = signed_in.post(
        reverse("login"), {"username": "Nina.K", "password": NEW_PASSWORD}, follow=True
    )
    assert landing.redirect_chain[-1][0] == reverse("tenant-detail", kwargs={"slug": "acme"})

    # The link has done its job: it no longer works.
    again = Client().get(link, follow=True).content.decode()
    assert "This link no longer works" in again
    assert "new_password1" not in again


def test_inviting_an_existing_user_just_adds_them_without_a_link(
    member, other_member, tenant, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in(member).post(
            invite_url(), {"email": "OSCAR@globex.example", "role": "admin"}
        )
    page = response.content.decode()
    assert response.status_code == 200
    assert "They had an account already." in page
    assert "set-password-link" not in page
    assert Membership.objects.get(user=other_member, tenant=tenant).role == "admin"
    assert User.objects.filter(email__iexact="oscar@globex.example").count() == 1
    assert mail.outbox == []


def test_an_account_another_tenant_invited_gets_its_link_by_mail_never_shown_to_this_admin(
    member, tenant, other_tenant, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        first = services.member_invite(
            tenant=other_tenant, email="zoe@example.com", role="member", site_url="http://x"
        )
    assert first.created_user and first.set_password_url  # globex's admin made the account

    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in(member).post(
            invite_url(), {"email": "zoe@example.com", "role": "member"}
        )

    page = response.content.decode()
    assert response.status_code == 200
    assert "set-password-link" not in page and "/accounts/set-password/" not in page
    assert [m.to for m in mail.outbox] == [["zoe@example.com"], ["zoe@example.com"]]
    assert "/accounts/set-password/" in mail.outbox[1].body


def test_a_taken_username_gets_a_number(member, tenant):
    User.objects.create_user("nina", "nina@elsewhere.example")
    invitation = services.member_invite(
        tenant=tenant, email="nina@acme.example", role="member", site_url="http://x"
    )
    assert invitation.membership.user.username == "nina2"
    assert invitation.created_user


def test_a_bad_email_is_refused_next_to_the_field_and_nothing_changes(member):
    client = logged_in(member)
    before = state()
    response = client.post(
        invite_url(), {"email": "not-an-address", "role": "member"}, headers=HTMX
    )
    page = response.content.decode()
    assert response.status_code == 400
    assert '<p class="field-error" id="id_email-error">Enter a valid email address.</p>' in page
    assert 'value="not-an-address"' in page
    assert state() == before
    assert mail.outbox == []


def test_inviting_someone_who_is_a_member_already_names_the_email_field(member, colleague):
    before = state()
    response = logged_in(member).post(invite_url(), {"email": "mike@acme.example", "role": "admin"})
    assert response.status_code == 400
    assert "mike@acme.example is already a member of Acme AI" in response.content.decode()
    assert 'id="id_email-error"' in response.content.decode()
    assert state() == before


def test_an_unknown_role_is_refused_by_the_service(member, tenant):
    with pytest.raises(Exception) as refused:
        services.member_invite(
            tenant=tenant, email="x@acme.example", role="owner", site_url="http://x"
        )
    assert refused.value.message_dict == {"role": ["unknown role 'owner'; choose admin or member"]}


# --- roles and removal ------------------------------------------------------------------------


def test_admin_promotes_and_demotes_a_member(member, colleague):
    client = logged_in(member)
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


def test_admin_removes_a_member_who_then_loses_the_tenant(member, colleague):
    client = logged_in(member)
    response = client.post(remove_url(colleague))
    assert response.status_code == 302
    assert not Membership.objects.filter(pk=colleague.pk).exists()
    assert User.objects.filter(username="mike").exists()  # the account stays
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


def test_api_invite_by_an_admin_answers_the_member_and_the_link(member_api, tenant):
    response = member_api.post(
        members_api(tenant), {"email": "nina@acme.example", "role": "member"}, format="json"
    )
    assert response.status_code == 201
    assert response.data["member"]["username"] == "nina"
    assert response.data["created_user"] is True
    assert response.data["set_password_url"].startswith("http://testserver/accounts/set-password/")


def test_api_bad_email_is_400_naming_the_field(member_api, tenant):
    before = state()
    response = member_api.post(members_api(tenant), {"email": "nope"}, format="json")
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
            client.post(members_api(tenant), {"email": "x@acme.example"}, format="json").status_code
            == 403
        )
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
            members_api(tenant), {"email": "x@y.example"}, format="json"
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
