"""The period (and, for operators, the tenant) a usage page or export asks for.

Periods are whole UTC days, half-open: ``since`` is the first day counted, ``until`` the first
day not counted, so a calendar month is ``since=2026-11-01&until=2026-12-01``. The same rule
serves the pages, the page exports and the API (``period_between``).
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone

from gpucap.tenancy.models import Tenant
from gpucap.usage import services, webhook
from gpucap.usage.models import BillingWebhook
from gpucap.web.forms import ServiceErrorsMixin

MAX_DAYS = 366
# What a usage page shows when no period is asked for: the last DEFAULT_DAYS days, today
# included. A calendar month would show a single day on the 1st and hide the weeks before it;
# a month (an invoice's period) is one click away in the month picker.
DEFAULT_DAYS = 30


@dataclass(frozen=True)
class Period:
    since: date
    until: date  # the first day not counted

    @property
    def start(self) -> datetime:
        return datetime.combine(self.since, time(), tzinfo=UTC)

    @property
    def end(self) -> datetime:
        return datetime.combine(self.until, time(), tzinfo=UTC)

    @property
    def month(self) -> str:
        """``2026-11`` when the period is exactly one calendar month, else empty."""
        if self.since.day == 1 and self.until == _next_month(self.since):
            return self.since.strftime("%Y-%m")
        return ""

    @property
    def last_day(self) -> date:
        return self.until - timedelta(days=1)

    @property
    def label(self) -> str:
        if self.month:
            return self.since.strftime("%B %Y")
        if self.last_day == self.since:
            return self.since.isoformat()
        return f"{self.since.isoformat()} to {self.last_day.isoformat()}"

    @property
    def name(self) -> str:
        """For file names: ``2026-11`` for a month, ``2026-11-03_2026-11-10`` otherwise."""
        return self.month or f"{self.since.isoformat()}_{self.until.isoformat()}"

    def query(self) -> dict[str, str]:
        return {"since": self.since.isoformat(), "until": self.until.isoformat()}


def period_between(since: date, until: date) -> Period:
    """[since, until) if it is a valid period; a ValidationError naming ``until`` otherwise."""
    if until <= since:
        raise ValidationError({"until": "must be a later day than since"})
    if (until - since).days > MAX_DAYS:
        raise ValidationError({"until": f"a period is at most {MAX_DAYS} days"})
    return Period(since=since, until=until)


def month_period(day: date) -> Period:
    """The calendar month ``day`` falls in."""
    first = day.replace(day=1)
    return Period(since=first, until=_next_month(first))


def this_month() -> Period:
    return month_period(today())


def recent_days() -> Period:
    """The default period: the last ``DEFAULT_DAYS`` whole UTC days, today the last of them."""
    until = today() + timedelta(days=1)
    return Period(since=until - timedelta(days=DEFAULT_DAYS), until=until)


def today() -> date:
    return timezone.now().astimezone(UTC).date()


def _next_month(first: date) -> date:
    return first.replace(year=first.year + first.month // 12, month=first.month % 12 + 1)


# Choosing a month clears the days, choosing a day clears the month: the days would win.
# static/gpucap.js reads data-clears (an inline handler would be refused by the CSP).
CLEAR_DAYS = "since until"
CLEAR_MONTH = "month"


class MonthField(forms.CharField):
    widget = forms.TextInput(
        attrs={"type": "month", "placeholder": "YYYY-MM", "data-clears": CLEAR_DAYS}
    )
    default_error_messages = {"invalid": "Enter a month as YYYY-MM."}

    def to_python(self, value):
        value = super().to_python(value)
        if not value:
            return None
        try:
            return datetime.strptime(value, "%Y-%m").date()
        except ValueError:
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None


class DayField(forms.DateField):
    widget = forms.DateInput(attrs={"type": "date", "data-clears": CLEAR_MONTH}, format="%Y-%m-%d")
    input_formats = ["%Y-%m-%d"]
    default_error_messages = {"invalid": "Enter a day as YYYY-MM-DD."}


class UsagePeriodForm(forms.Form):
    """A month, or a range of days (``since``, ``until``): days given win over a month; nothing
    at all means ``default``: on the pages the last ``DEFAULT_DAYS`` days (``recent_days``), in
    the exports this month. ``tenants``, for operators: the tenant field (a slug; empty:
    all). The page clears the other kind of field when one is changed (a line of script in
    the widgets), so what was changed last is what is shown."""

    default_days = DEFAULT_DAYS

    month = MonthField(required=False)
    since = DayField(required=False, label="From")
    until = DayField(required=False, label="Before", help_text="The first day not counted.")
    tenant = forms.ChoiceField(required=False, label="Tenant")

    def __init__(
        self,
        data=None,
        *,
        tenants: list[Tenant] | None = None,
        default: Callable[[], Period] = recent_days,
    ) -> None:
        super().__init__(data)
        self.default = default
        # Nothing asked for: the page says which period it shows by default.
        self.is_default = not any((data or {}).get(name) for name in ("month", "since", "until"))
        self.tenant_list = tenants
        self.tenants = {tenant.slug: tenant for tenant in tenants or []}
        if tenants is None:
            del self.fields["tenant"]
        else:
            self.fields["tenant"].choices = [
                ("", "All tenants"),
                *[(tenant.slug, tenant.name) for tenant in tenants],
            ]
            self.fields["tenant"].error_messages["invalid_choice"] = "No tenant %(value)s."

    def clean(self):
        data = super().clean()
        if any(name in self.errors for name in ("since", "until", "month")):
            return data
        since, until, month = data.get("since"), data.get("until"), data.get("month")
        if since or until:
            if since is None:
                raise ValidationError({"since": "Give the first day as well."})
            if until is None:
                raise ValidationError({"until": "Give the first day not counted as well."})
            data["period"] = period_between(since, until)
        elif month is not None:
            data["period"] = month_period(month)
        else:
            data["period"] = self.default()
        return data

    @property
    def period(self) -> Period:
        """The period asked for; the default when the form is invalid."""
        if self.is_valid():
            return self.cleaned_data["period"]
        return self.default()

    @property
    def chosen_tenant(self) -> Tenant | None:
        if self.is_valid() and self.cleaned_data.get("tenant"):
            return self.tenants[self.cleaned_data["tenant"]]
        return None

    def shown(self) -> "UsagePeriodForm":
        """The form to draw: this one with its errors when invalid, else one showing the period
        asked for: a month in the month field, a range of days in the day fields."""
        if not self.is_valid():
            return self
        period = self.period
        data = {"month": period.month} if period.month else period.query()
        if "tenant" in self.fields:
            data["tenant"] = self.cleaned_data.get("tenant") or ""
        shown = UsagePeriodForm(data, tenants=self.tenant_list, default=self.default)
        shown.is_valid()
        shown.is_default = self.is_default
        return shown

    def error_text(self) -> str:
        """Every error in one line, each naming its field: ``until: must be ...``."""
        return "; ".join(
            f"{field}: {message}" if field != "__all__" else message
            for field, messages in self.errors.items()
            for message in messages
        )


# --- the billing webhook's settings: the shape of what was typed; the rules are
# services.billing_webhook_configure's, and its errors land next to the fields they name.
class BillingWebhookForm(ServiceErrorsMixin, forms.Form):
    url = forms.CharField(
        label="URL",
        max_length=services.BILLING_URL_MAX_LENGTH,
        help_text="Where batches of usage records are POSTed: https:// (or http:// inside "
        "your network).",
        widget=forms.URLInput(
            attrs={"placeholder": "https://billing.example.com/gpucap/usage", "autocomplete": "off"}
        ),
    )
    secret = forms.CharField(
        required=False,
        max_length=services.BILLING_SECRET_MAX_LENGTH,
        help_text=f"At least {services.BILLING_SECRET_MIN_LENGTH} characters; signs every "
        "delivery. Leave empty to keep the current one.",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )
    generate_secret = forms.BooleanField(
        required=False,
        label="Generate a new secret",
        help_text="gpucap picks a random 256-bit secret and shows it once.",
    )
    enabled = forms.BooleanField(
        required=False,
        label="Push usage records",
        help_text="Ticked: new records are sent to the URL in batches as they are made. "
        "Unticked: nothing is sent; records wait and go once pushing is back on.",
    )
    batch_size = forms.IntegerField(
        label="Batch size",
        initial=BillingWebhook._meta.get_field("batch_size").default,
        help_text=f"Records per delivery, 1 to {services.BILLING_BATCH_SIZE_MAX}.",
        widget=forms.NumberInput(attrs={"min": 1, "max": services.BILLING_BATCH_SIZE_MAX}),
    )

    @classmethod
    def of(cls, hook: BillingWebhook | None) -> "BillingWebhookForm":
        if hook is None:
            return cls(initial={"enabled": True})
        return cls(
            initial={"url": hook.url, "enabled": hook.enabled, "batch_size": hook.batch_size}
        )

    def service_arguments(self) -> dict:
        data = self.cleaned_data
        secret = webhook.new_secret() if data["generate_secret"] else data["secret"] or None
        return {
            "url": data["url"],
            "secret": secret,
            "enabled": data["enabled"],
            "batch_size": data["batch_size"],
        }
