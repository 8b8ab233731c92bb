"""Every form of the site answers bad input in place (issue 15), against the app as `make run`
serves it: the ASGI application (``gpucap.asgi:application``, the router and metadata fronts
included) under uvicorn, with DEBUG on. Each form gets one bad input from the reader it is for;
the page keeps the site's layout (its menu for a signed-in reader), the field's message stands
next to the field, and nothing changed in the database."""

import re
from datetime import date, timedelta

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.tokens import default_token_generator
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from playwright.sync_api import Page, expect

from gpucap.fleet.models import Node
from gpucap.inference import services as inference
from gpucap.inference.models import ApiKey, InferenceDeployment
from gpucap.tenancy import services as tenancy
from gpucap.tenancy.models import Invitation, Membership
from gpucap.usage.models import BillingWebhook
from tests.asgi_server import asgi_served
from tests.browser.conftest import log_in
from tests.conftest import PASSWORD
from tests.inference import conftest as inference_fixtures
from tests.rentals.vm_helpers import SSH_KEY, grant_pools, world

pytestmark = pytest.mark.django_db(transaction=True)
inference_pools = inference_fixtures.inference_pools


@pytest.fixture
def make_run_server(transactional_db):
    """``gpucap.asgi:application`` under uvicorn on a free port of 127.0.0.1, in a thread of
    its own, as the Procfile's web process serves it."""
    with asgi_served() as url:
        yield url


@pytest.fixture
def page(browser, make_run_server) -> Page:
    context = browser.new_context(base_url=make_run_server, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()


def expect_in_place(page: Page, field_id: str, message: str, *, menu: bool = True) -> None:
    """The page kept the site's layout (one top bar, its menu when signed in, the stylesheet),
    and the field's message stands next to it: the error and the field share their box."""
    error = page.locator(f"#{field_id}-error")
    expect(error).to_contain_text(message)
    expect(error).to_be_visible()
    expect(page.locator("header.topbar")).to_have_count(1)
    if menu:
        expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    assert page.evaluate("document.styleSheets.length") >= 1
    beside = error.evaluate(
        "(error, id) => error.parentElement.contains(document.getElementById(id))", field_id
    )
    assert beside, f"#{field_id}-error is not next to #{field_id}"


def submit_with_no_browser_checks(form) -> None:
    """Bad input the browser's own checks would stop first (a malformed address, an empty
    field) reaches the server as a script or an older browser would send it."""
    form.evaluate("form => { form.noValidate = true; }")


# --- operators ------------------------------------------------------------------------------


def test_operator_forms_answer_bad_input_in_place(page, operator, fleet_east):
    # The whole ASGI app answers, not Django alone: its router front refuses a keyless call.
    router = page.request.get("/inference/acme-chat/v1/models")
    assert (router.status, router.json()["error"]["code"]) == (401, "invalid_api_key")
    log_in(page, operator.username)

    # What if: 6 GPUs in blocks of 8 on the NVSwitch set.
    page.goto("/fleet/sets/h100-east/")
    what_if = page.locator("#what-if")
    what_if.get_by_label("Pool").select_option(label="2. h100-ondemand (On-demand)")
    what_if.get_by_label("GPUs").fill("6")
    what_if.get_by_label("In blocks of").select_option("8")
    what_if.get_by_role("button", name="Preview").click()
    expect_in_place(page, "id_gpus", "not a whole number of 8-GPU blocks")
    expect(page.locator("#what-if")).to_have_count(1)

    # Billing webhook: a secret too short to sign with.
    page.goto("/usage/billing/")
    settings = page.locator("#billing-settings")
    settings.locator("input[name=url]").fill("https://billing.example.com/usage")
    settings.locator("input[name=secret]").fill("short")
    settings.get_by_role("button", name="Save").click()
    expect_in_place(page, "id_secret", "at least")
    expect(settings.locator("input[name=url]")).to_have_value("https://billing.example.com/usage")
    assert not BillingWebhook.objects.exists()

    # Usage period: a range that ends before it starts.
    page.goto("/usage/")
    period = page.locator("form.usage-period")
    period.locator("input[name=since]").fill("2026-11-05")
    period.locator("input[name=until]").fill("2026-11-01")
    period.get_by_role("button", name="Show").click()
    expect_in_place(page, "id_until", "must be a later day than since")

    # Fleet filter: a state no node has, from a stale or hand-made link: ignored, every node shown.
    page.goto("/fleet/?state=melting")
    expect_in_place(page, "id_state", "melting is not one of the available choices")
    expect(page.locator("#fleet-grid a.tile")).to_have_count(Node.objects.count())

    # VM filter: the same on the VM list.
    page.goto("/vms/?tenant=nobody")
    expect_in_place(page, "id_tenant", "nobody is not one of the available choices")


# --- a tenant's admin -----------------------------------------------------------------------


def test_tenant_forms_answer_bad_input_in_place(
    page, member, tenant, other_tenant, fleet_east, inference_pools
):
    grant_pools(fleet_east, tenant, other_tenant)
    deployment = inference.deployment_create(
        tenant=tenant,
        pool=inference_pools["standalone"],
        name="chat",
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        gpus_per_replica=1,
        max_replicas=2,
    )
    log_in(page, member.username)

    # Request VM: 3 GPUs on an NVSwitch pool.
    page.goto("/tenants/acme/vms/")
    before = world()
    form = page.locator("#vm-request form")
    option = form.locator("select[name=pool] option", has_text=re.compile(r"^a100-standalone ·"))
    form.locator("select[name=pool]").select_option(option.get_attribute("value"))
    form.locator("input[name=name]").fill("train-01")
    form.locator("input[name=gpu_count]").fill("3")
    form.locator("textarea[name=ssh_public_key]").fill(SSH_KEY)
    form.get_by_role("button", name="Request VM").click()
    expect_in_place(page, "id_gpu_count", "whole partitions of 1, 2, 4 or 8 GPUs")
    expect(form.locator("input[name=name]")).to_have_value("train-01")
    assert world() == before

    # Create deployment: at least one replica more than its maximum.
    page.goto("/tenants/acme/inference/")
    form = page.locator("#deployment-create form")
    form.locator("input[name=name]").fill("embed")
    form.locator("input[name=model_name]").fill("BAAI/bge-m3")
    form.locator("input[name=min_replicas]").fill("3")
    form.locator("input[name=max_replicas]").fill("2")
    form.get_by_role("button", name="Create deployment").click()
    expect_in_place(page, "id_min_replicas", "must not exceed the maximum of 2 replicas")
    assert list(InferenceDeployment.objects.values_list("name", flat=True)) == ["chat"]

    # A deployment's settings, then an API key that expired before it was made.
    page.goto("/tenants/acme/inference/chat/")
    settings = page.locator("#deployment-settings")
    settings.locator("input[name=min_replicas]").fill("5")
    settings.get_by_role("button", name="Save").click()
    expect_in_place(page, "id_min_replicas", "must not exceed the maximum of 2 replicas")
    deployment.refresh_from_db()
    assert (deployment.min_replicas, deployment.max_replicas) == (1, 2)

    keys = page.locator("#api-keys")
    keys.locator("input[name=name]").fill("production chatbot")
    keys.locator("input[name=expires_on]").fill((date.today() - timedelta(days=1)).isoformat())
    keys.get_by_role("button", name="Create key").click()
    expect_in_place(page, "id_expires_on", "must be in the future")
    assert not ApiKey.objects.exists()

    # Invite member: someone who is already a member.
    page.goto("/tenants/acme/members/")
    invite = page.locator("#member-invite form")
    invite.locator("input[name=email]").fill(member.email)
    invite.get_by_role("button", name="Invite").click()
    expect_in_place(page, "id_email", "is already a member of Acme AI")
    assert not Invitation.objects.exists()

    # The tenant's own usage period: a month typed by hand.
    page.goto("/tenants/acme/usage/?month=November")
    expect_in_place(page, "id_month", "Enter a month as YYYY-MM")


# --- no one signed in -----------------------------------------------------------------------


def test_sign_in_says_when_to_try_again_after_too_many_wrong_passwords(page, member, settings):
    settings.PASSWORD_ATTEMPTS_PER_ACCOUNT = (2, 900)
    for password in ("guess-1", "guess-2", PASSWORD):  # the right one last: refused too
        page.goto("/login/")
        page.fill("input[name=username]", member.username)
        page.fill("input[name=password]", password)
        page.get_by_role("button", name="Sign in").click()
    alert = page.locator(".login [role=alert]")
    expect(alert).to_contain_text("Too many attempts for this account or from your address")
    expect(alert).to_contain_text(
        re.compile(r"Try again in \d+ (seconds?|minutes?) \(at \d\d:\d\d:\d\d UTC\)")
    )
    expect(page.locator("input[name=username]")).to_have_value(member.username)
    expect(page.get_by_role("navigation", name="Main")).to_have_count(0)  # not signed in


def test_sign_in_and_password_forms_answer_bad_input_in_place(
    page, member, tenant, operator, mailoutbox
):
    # Sign in with a wrong password: said above the form, the username kept.
    page.goto("/login/")
    page.fill("input[name=username]", member.username)
    page.fill("input[name=password]", "not-the-password")
    page.get_by_role("button", name="Sign in").click()
    alert = page.locator(".login [role=alert]")
    expect(alert).to_contain_text("Please enter a correct username and password")
    expect(page.locator("header.topbar")).to_have_count(1)
    expect(page.locator("input[name=username]")).to_have_value(member.username)

    # Password reset with a malformed address.
    page.goto("/accounts/password-reset/")
    page.fill("input[name=email]", "mallory-at-acme")
    page.get_by_role("button", name="Mail me a link").click()
    expect_in_place(page, "id_email", "Enter a valid email address", menu=False)

    # Set a password with two different passwords: the old one still works.
    uid = urlsafe_base64_encode(force_bytes(member.pk))
    token = default_token_generator.make_token(member)
    page.goto(f"/accounts/set-password/{uid}/{token}/")
    page.fill("input[name=new_password1]", "a-new-long-passphrase-1")
    page.fill("input[name=new_password2]", "a-new-long-passphrase-2")
    page.get_by_role("button", name="Set password").click()
    expect_in_place(page, "id_new_password2", "The two password fields didn", menu=False)
    assert User.objects.get(pk=member.pk).check_password(PASSWORD)

    # Accept an invitation with a new account and two different passwords.
    tenancy.invitation_send(
        tenant=tenant,
        email="nina@acme.example",
        role=Membership.Role.MEMBER,
        site_url="http://gpucap.example",
        actor=operator,
    )
    link = re.search(r"http://gpucap.example(/invitations/[^\s]+/)", mailoutbox[-1].body)
    page.goto(link.group(1))
    page.fill("input[name=username]", "nina")
    page.fill("input[name=password1]", "a-new-long-passphrase-1")
    page.fill("input[name=password2]", "a-new-long-passphrase-2")
    page.get_by_role("button", name="Make the account and join").click()
    expect_in_place(page, "id_password2", "The two passwords differ", menu=False)
    assert not User.objects.filter(username="nina").exists()
