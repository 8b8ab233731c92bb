"""The notices page: every open interruption notice with a live countdown to its deadline, and
the ones completed in the last day. Operators see the whole fleet's; a tenant member sees the
notices of their own tenants' VMs and nothing else.

The countdown ticks in the browser from each notice's deadline (``static/countdown.js``); the
table itself is re-fetched every few seconds so new notices appear and finished ones move on.
"""

from datetime import timedelta

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from gpucap.notices.models import InterruptionNotice
from gpucap.notices.selectors import notices_visible_to
from gpucap.web.pages import render_page

Reason = InterruptionNotice.Reason

# How far back the "recently completed" table looks, and how many rows it shows at most.
RECENT = timedelta(hours=24)
RECENT_LIMIT = 100


class NoticeFilterForm(forms.Form):
    STATUS_CHOICES = [("", "Open and completed"), ("open", "Open"), ("completed", "Completed")]

    reason = forms.ChoiceField(choices=[("", "Any reason"), *Reason.choices], required=False)
    status = forms.ChoiceField(choices=STATUS_CHOICES, required=False)

    def filters(self) -> dict:
        """The valid filters that are set; a bad value is reported on the page and ignored."""
        self.is_valid()
        return {name: value for name, value in self.cleaned_data.items() if value}


@require_GET
@login_required
def notice_list(request: HttpRequest) -> HttpResponse:
    form = NoticeFilterForm(request.GET)
    filters = form.filters()
    notices = notices_visible_to(request.user)
    if "reason" in filters:
        notices = notices.filter(reason=filters["reason"])
    status = filters.get("status")
    now = timezone.now()
    open_notices = (
        list(notices.filter(completed_at=None).order_by("deadline", "id"))
        if status != "completed"
        else None
    )
    completed = (
        list(
            notices.filter(completed_at__gte=now - RECENT).order_by("-completed_at", "-id")[
                :RECENT_LIMIT
            ]
        )
        if status != "open"
        else None
    )
    context = {
        "nav": "notices",
        "form": form,
        "filtered": bool(filters),
        "open_notices": open_notices,
        "completed": completed,
        "query": request.GET.urlencode(),
    }
    return render_page(request, "notices/notice_list.html", context, fragment="notice-tables")
