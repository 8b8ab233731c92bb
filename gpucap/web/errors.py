"""The site's own 404 and 500 pages under DEBUG too (``make run``, the demo).

With DEBUG on, Django answers a missing page with its technical 404 (every URL pattern of the
site) and a crash with its traceback page. Operators and tenants of the demo see the site's own
pages instead, in its layout; the details stay where developers look for them, in the log
(``django.request``). JSON answers (the API) and HTMX fragments are left as they are, and so is
any 404 a view rendered itself. Without DEBUG, Django's own handlers already use these pages.
"""

import logging

from django.conf import settings
from django.shortcuts import render

logger = logging.getLogger(__name__)

# Only Django's technical pages say this; the site's own error pages never do.
_TECHNICAL = b"DEBUG = True"


class FriendlyErrorPages:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            not settings.DEBUG
            or response.status_code not in (404, 500)
            or not response.get("Content-Type", "").startswith("text/html")
            or request.headers.get("HX-Request") == "true"
            or _TECHNICAL not in getattr(response, "content", b"")
        ):
            return response
        try:
            return render(request, f"{response.status_code}.html", status=response.status_code)
        except Exception:  # a page that cannot render: Django's own answer is still an answer
            logger.exception("the friendly %s page could not be rendered", response.status_code)
            return response
