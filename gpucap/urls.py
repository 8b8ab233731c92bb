from csp.constants import SELF, UNSAFE_INLINE
from csp.decorators import csp_update
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerSplitView,
)

from gpucap import observability
from gpucap.tenancy import views as tenancy_views


def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness for load balancers and process supervisors: the Django stack answers."""
    return HttpResponse("ok", content_type="text/plain")


# The instance metadata endpoint (/latest/, /computeMetadata/, /metadata/) is not here: it is
# served in front of Django by gpucap/asgi.py (gpucap/notices/metadata.py).
urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", observability.metrics_view, name="metrics"),
    path("admin/login/", tenancy_views.admin_login),  # throttled; admin's own name kept
    path("admin/", admin.site.urls),
    path("login/", tenancy_views.login_page, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # Swagger UI with its start-up script served apart (?script), not inline: the CSP allows none.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    # Redoc styles itself through <style> elements it writes (styled-components) and searches in
    # a worker it makes from a blob: its page alone allows both. Its scripts are this site's only
    # (its "powered by" logo, from Redocly's CDN, stays blocked).
    path(
        "api/redoc/",
        csp_update({"style-src": [UNSAFE_INLINE], "worker-src": [SELF, "blob:"]})(
            SpectacularRedocView.as_view(url_name="api-schema")
        ),
        name="api-redoc",
    ),
    path("api/", include("gpucap.api.urls")),
    path("", include("gpucap.portal.urls")),
    path("", include("gpucap.tenancy.urls")),
    path("fleet/quotas/", include("gpucap.allocation.urls")),
    path("fleet/", include("gpucap.console.urls")),
    path("fleet/sets/<slug:name>/", include("gpucap.plans.urls")),
    path("audit/", include("gpucap.audit.urls")),
    path("", include("gpucap.vms.urls")),
    path("notices/", include("gpucap.notices.urls")),
    path("", include("gpucap.inference.urls")),
    path("", include("gpucap.usage.urls")),
]

# Under /api/ Django's own 400 and 500 answers are the API's JSON error (gpucap/api/errors.py).
handler400 = "gpucap.api.errors.handler400"
handler500 = "gpucap.api.errors.handler500"
