"""The billing webhook page: operators configure it (a new secret is shown once), see its state
and the latest deliveries with their errors, and send a batch now. Bad settings are refused next
to the field and change nothing; everyone else gets 403."""

import pytest
from django.urls import reverse

from gpucap.audit.models import AuditEvent
from gpucap.usage import services
from gpucap.usage.models import BillingDelivery, BillingWebhook
from tests.usage import test_webhook as webhook_tests
from tests.usage.test_webhook import SECRET, closed_port

HTMX = {"HX-Request": "true"}
PAGE = "/usage/billing/"
SEND = "/usage/billing/send/"

records = webhook_tests.records
receiver = webhook_tests.receiver


def configure(url: str, *, enabled: bool = True, batch_size: int = 100) -> BillingWebhook:
    return services.billing_webhook_configure(
        url=url, secret=SECRET, enabled=enabled, batch_size=batch_size, actor=None
    )


def settings_of() -> tuple | None:
    return BillingWebhook.objects.values_list("url", "secret", "enabled", "batch_size").first()


def test_the_url_names_are_the_ones_other_pages_link_to():
    assert reverse("usage:billing") == PAGE
    assert reverse("usage:billing-send") == SEND


def test_an_operator_without_a_webhook_sees_the_empty_form(operator_client):
    response = operator_client.get(PAGE)

    assert response.status_code == 200
    html = response.content.decode()
    assert "No billing webhook yet" in html
    assert "No secret yet" in html
    assert 'name="url"' in html and 'name="batch_size"' in html


@pytest.mark.parametrize(("method", "url"), [("get", PAGE), ("post", PAGE), ("post", SEND)])
def test_tenant_members_get_403_and_anonymous_visitors_go_to_login(
    client, member, method, url, records, receiver
):
    configure(receiver.url)
    assert getattr(client, method)(url)["Location"].startswith(reverse("login"))
    client.force_login(member)
    data = {"url": "https://evil.example/", "secret": "x" * 20, "batch_size": 1, "enabled": "on"}

    assert getattr(client, method)(url, data).status_code == 403

    assert settings_of()[0] == receiver.url
    assert receiver.deliveries == [] and not BillingDelivery.objects.exists()


def test_saving_settings_with_a_generated_secret_shows_it_once_and_audits_the_change(
    operator_client, operator
):
    response = operator_client.post(
        PAGE,
        {
            "url": "https://billing.example.com/gpucap/usage",
            "generate_secret": "on",
            "enabled": "on",
            "batch_size": "250",
        },
        headers=HTMX,
    )

    assert response.status_code == 200
    assert response["HX-Trigger"] == "billing-changed"
    assert "no-store" in response["Cache-Control"]
    hook = BillingWebhook.objects.get()
    assert (hook.url, hook.enabled, hook.batch_size) == (
        "https://billing.example.com/gpucap/usage",
        True,
        250,
    )
    html = response.content.decode()
    assert len(hook.secret) >= 32 and hook.secret in html
    assert "only time it is shown" in html
    assert "<html" not in html and 'id="billing-status"' not in html  # the fragment only

    event = AuditEvent.objects.get(verb="billing_webhook.configure")
    assert event.actor == operator
    assert event.after == {
        "url": "https://billing.example.com/gpucap/usage",
        "enabled": True,
        "batch_size": 250,
        "secret": "changed",
    }
    assert hook.secret not in str(event.before) + str(event.after) + event.message

    page = operator_client.get(PAGE).content.decode()
    assert hook.secret not in page
    assert "A secret is set" in page


def test_changing_settings_without_a_secret_keeps_the_secret(operator_client):
    configure("https://billing.example.com/a")

    response = operator_client.post(
        PAGE, {"url": "https://billing.example.com/b", "batch_size": "10"}, headers=HTMX
    )

    assert response.status_code == 200
    assert settings_of() == ("https://billing.example.com/b", SECRET, False, 10)
    assert SECRET not in response.content.decode()
    assert "Saved." in response.content.decode()


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"url": "ftp://billing.example.com/"}, "url", "must be an http:// or https:// URL"),
        ({"url": "billing.example.com"}, "url", "must be an http:// or https:// URL"),
        ({"url": ""}, "url", "This field is required"),
        ({"secret": "too-short"}, "secret", "must be at least 16 characters, got 9"),
        ({"batch_size": "0"}, "batch_size", "must be 1 to 5000 records, got 0"),
        ({"batch_size": "5001"}, "batch_size", "must be 1 to 5000 records"),
        ({"batch_size": "many"}, "batch_size", "Enter a whole number"),
    ],
)
def test_bad_settings_are_refused_next_to_the_field_and_change_nothing(
    operator_client, data, field, message
):
    configure("https://billing.example.com/usage")
    before, events = settings_of(), AuditEvent.objects.count()
    form = {"url": "https://billing.example.com/new", "batch_size": "100", "enabled": "on"}

    response = operator_client.post(PAGE, form | data, headers=HTMX)

    assert response.status_code == 400
    html = response.content.decode()
    assert f"field-{field} field-invalid" in html
    assert message in html
    assert settings_of() == before and AuditEvent.objects.count() == events


def test_a_first_configuration_needs_a_secret(operator_client):
    response = operator_client.post(
        PAGE, {"url": "https://billing.example.com/usage", "batch_size": "100"}, headers=HTMX
    )

    assert response.status_code == 400
    assert "field-secret field-invalid" in response.content.decode()
    assert not BillingWebhook.objects.exists()


def test_the_status_refreshes_as_a_fragment_in_a_fixed_number_of_queries(
    operator_client, records, receiver, django_assert_num_queries
):
    configure(receiver.url, batch_size=1)
    services.billing_push()
    # session, user, operator group; the webhook, records waiting, deliveries.
    with django_assert_num_queries(6):
        operator_client.get(PAGE, headers=HTMX)
    for _ in range(3):
        services.billing_push()
    with django_assert_num_queries(6):
        response = operator_client.get(PAGE, headers=HTMX)

    html = response.content.decode()
    assert html.lstrip().startswith('<div id="billing-status"')
    assert "<html" not in html and 'name="url"' not in html
    assert html.count('class="delivery delivery-accepted"') == 4
    assert '<dd class="records-waiting">1</dd>' in html


def test_a_refused_connection_is_recorded_and_shown_with_its_error(operator_client, records):
    configure(f"http://127.0.0.1:{closed_port()}/usage")

    response = operator_client.post(SEND, headers=HTMX)

    assert response.status_code == 200
    html = response.content.decode()
    assert "failed: could not connect" in html and "Connection refused" in html
    hook = BillingWebhook.objects.get()
    assert hook.cursor == 0 and hook.consecutive_failures == 1
    page = operator_client.get(PAGE).content.decode()
    assert 'class="delivery delivery-failed"' in page
    assert "no answer" in page and "Connection refused" in page
    assert "backing off" in page
    assert AuditEvent.objects.filter(
        verb="billing_webhook.push", message__contains="could not connect"
    ).exists()


def test_a_receiver_that_times_out_shows_on_the_page(operator_client, records, receiver, settings):
    settings.BILLING_WEBHOOK_TIMEOUT_SECONDS = 1
    configure(receiver.url)
    receiver.delay = 1.5

    services.billing_push()

    page = operator_client.get(PAGE).content.decode()
    assert "timed out: no answer within 1 s" in page
    assert BillingWebhook.objects.get().cursor == 0


def test_send_now_delivers_a_batch_and_says_so(operator_client, records, receiver):
    configure(receiver.url, batch_size=2)
    receiver.answers = [500]
    services.billing_push()  # failed: backing off

    response = operator_client.post(SEND, headers=HTMX)

    assert response.status_code == 200
    assert "The receiver accepted batch" in response.content.decode()
    assert [d["status"] for d in receiver.deliveries] == [500, 200]
    assert '<dd class="records-waiting">3</dd>' in response.content.decode()


def test_send_now_while_the_webhook_is_off_sends_nothing_and_says_why(
    operator_client, records, receiver
):
    configure(receiver.url, enabled=False)

    response = operator_client.post(SEND, headers=HTMX)

    assert response.status_code == 409
    assert "The webhook is off" in response.content.decode()
    assert receiver.deliveries == []
