"""Every password form is throttled per account and per client address (#16): wrong passwords
on /login/ and /admin/login/, and every post of the reset request, set-password and an
invitation's new-account forms. Once used up, the right password is refused too, with a
message that says when to try again; a successful sign-in resets nobody else's count."""

import re

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from gpucap.envvars import env_rate
from gpucap.tenancy import services
from gpucap.tenancy.models import Membership
from tests.conftest import PASSWORD

NEW_PASSWORD = "violet-kettle-orbit-42"


def sign_in(client, username, password, url="/login/", address="203.0.113.5"):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)


def signed_in(client) -> bool:
    return "_auth_user_id" in client.session


def assert_throttled(response) -> None:
    assert response.status_code == 429
    assert 0 < int(response["Retry-After"]) <= 15 * 60
    page = response.content.decode()
    assert "Too many attempts for this account or from your address" in page
    assert re.search(r"Try again in \d+ (seconds|minutes) \(at \d\d:\d\d:\d\d UTC\)", page)


def test_forty_wrong_passwords_then_the_right_one_is_refused(member):
    client = Client()
    answers = [sign_in(client, "mallory", f"guess-{n}") for n in range(40)]
    assert [a.status_code for a in answers[:10]] == [200] * 10
    assert "Please enter a correct username and password" in answers[0].content.decode()
    for answer in answers[10:]:
        assert_throttled(answer)
    right = sign_in(client, "mallory", PASSWORD)
    assert_throttled(right)
    assert not signed_in(client)
    # The form is still there, the username kept.
    assert 'name="username"' in right.content.decode()
    assert 'value="mallory"' in right.content.decode()


def test_the_admins_sign_in_is_throttled_with_the_same_counts(operator):
    operator.is_superuser = True
    operator.save()
    client = Client()
    for n in range(6):
        sign_in(client, "olivia", f"guess-{n}", url="/login/")
    for n in range(4):
        assert sign_in(client, "olivia", f"guess-{n}", url="/admin/login/").status_code == 200
    right = sign_in(client, "olivia", PASSWORD, url="/admin/login/")
    assert_throttled(right)
    assert not signed_in(client)
    assert 'id="login-form"' in right.content.decode()  # the admin's own page


def test_one_account_guessed_from_many_addresses_is_throttled(member, settings):
    settings.PASSWORD_ATTEMPTS_PER_ACCOUNT = (3, 900)
    for n in range(3):
        sign_in(Client(), "MALLORY", "guess", address=f"198.51.100.{n}")
    client = Client()
    assert_throttled(sign_in(client, "mallory", PASSWORD, address="192.0.2.99"))
    assert not signed_in(client)
    # Other accounts are not held up by it.
    User.objects.create_user("mike", "mike@acme.example", PASSWORD)
    other = Client()
    assert sign_in(other, "mike", PASSWORD, address="192.0.2.99").status_code == 302
    assert signed_in(other)


def test_many_accounts_guessed_from_one_address_are_throttled(member, settings):
    settings.PASSWORD_ATTEMPTS_PER_CLIENT = (3, 900)
    for name in ("alice", "bob", "carol"):
        sign_in(Client(), name, "guess", address="203.0.113.7")
    client = Client()
    assert_throttled(sign_in(client, "mallory", PASSWORD, address="203.0.113.7"))
    assert not signed_in(client)
    elsewhere = Client()
    assert sign_in(elsewhere, "mallory", PASSWORD, address="203.0.113.8").status_code == 302


def test_a_successful_sign_in_does_not_reset_another_addresss_count(member, settings):
    settings.PASSWORD_ATTEMPTS_PER_CLIENT = (3, 900)
    settings.PASSWORD_ATTEMPTS_PER_ACCOUNT = (100, 900)
    guesser = Client()
    for n in range(2):
        sign_in(guesser, "mallory", f"guess-{n}", address="203.0.113.7")
    assert sign_in(Client(), "mallory", PASSWORD, address="192.0.2.1").status_code == 302
    assert sign_in(guesser, "mallory", "guess-2", address="203.0.113.7").status_code == 200
    assert_throttled(sign_in(guesser, "mallory", PASSWORD, address="203.0.113.7"))


def test_password_reset_requests_are_throttled(member, settings):
    settings.PASSWORD_ATTEMPTS_PER_ACCOUNT = (3, 900)
    url = reverse("password-reset")
    answers = [
        Client().post(url, {"email": "mallory@acme.example"}, REMOTE_ADDR=f"198.51.100.{n}")
        for n in range(4)
    ]
    assert [a.status_code for a in answers[:3]] == [302] * 3
    assert_throttled(answers[3])
    assert len(mail.outbox) == 3


def test_the_set_password_form_is_throttled(member, settings):
    settings.PASSWORD_ATTEMPTS_PER_CLIENT = (3, 900)
    Client().post(reverse("password-reset"), {"email": "mallory@acme.example"})
    link = re.search(r"http://testserver(/accounts/set-password/[^\s]+)", mail.outbox[0].body)
    client = Client()
    form_url = client.get(link.group(1), follow=True).redirect_chain[-1][0]
    for n in range(2):  # the reset request counted one already
        differ = {"new_password1": NEW_PASSWORD, "new_password2": f"other-{n}"}
        assert client.post(form_url, differ).status_code == 200
    right = client.post(form_url, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert_throttled(right)
    member.refresh_from_db()
    assert member.check_password(PASSWORD)


def test_an_invitations_new_account_form_is_throttled(
    member, tenant, settings, django_capture_on_commit_callbacks
):
    settings.PASSWORD_ATTEMPTS_PER_ACCOUNT = (3, 900)
    with django_capture_on_commit_callbacks(execute=True):
        services.invitation_send(
            tenant=tenant, email="nina@acme.example", role="member", site_url="http://testserver"
        )
    link = re.search(r"http://testserver(/invitations/[^\s]+/)", mail.outbox[-1].body).group(1)
    for n in range(3):
        taken = {"username": "mallory", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD}
        answer = Client().post(link, taken, REMOTE_ADDR=f"198.51.100.{n}")
        assert answer.status_code == 400
    good = {"username": "nina", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD}
    assert_throttled(Client().post(link, good, REMOTE_ADDR="192.0.2.50"))
    assert not User.objects.filter(username="nina").exists()
    assert not Membership.objects.filter(tenant=tenant, user__email="nina@acme.example").exists()


@pytest.mark.parametrize(
    ("text", "rate"),
    [("10/15m", (10, 900)), ("20/minute", (20, 60)), ("5/h", (5, 3600)), ("100/day", (100, 86400))],
)
def test_rates_are_read_from_the_environment(monkeypatch, text, rate):
    monkeypatch.setenv("PASSWORD_ATTEMPTS_PER_ACCOUNT", text)
    assert env_rate("PASSWORD_ATTEMPTS_PER_ACCOUNT", "1/s") == rate


@pytest.mark.parametrize("text", ["ten/minute", "10", "0/minute", "10/0m", "10/fortnight"])
def test_a_bad_rate_names_the_variable(monkeypatch, text):
    monkeypatch.setenv("PASSWORD_ATTEMPTS_PER_CLIENT", text)
    with pytest.raises(ImproperlyConfigured, match="PASSWORD_ATTEMPTS_PER_CLIENT"):
        env_rate("PASSWORD_ATTEMPTS_PER_CLIENT", "1/s")


def test_the_api_token_counts_wrong_passwords_with_the_sign_in_forms(member, settings):
    settings.PASSWORD_ATTEMPTS_PER_ACCOUNT = (3, 900)
    api = APIClient()
    for n in range(2):
        sign_in(Client(), "mallory", f"guess-{n}", address=f"198.51.100.{n}")
    wrong = api.post("/api/token/", {"username": "mallory", "password": "guess"}, format="json")
    assert wrong.status_code == 400
    right = api.post("/api/token/", {"username": "mallory", "password": PASSWORD}, format="json")
    assert right.status_code == 429
    assert right.json()["error"]["code"] == "throttled"
    assert "Try again in" in right.json()["error"]["message"]
    assert 0 < int(right["Retry-After"]) <= 900
    assert not Token.objects.exists()
    assert_throttled(sign_in(Client(), "mallory", PASSWORD))
