from django.urls import path

from gpucap.tenancy import views

# No namespace: "home" is where LOGIN_REDIRECT_URL sends everyone after signing in.
urlpatterns = [
    path("", views.home, name="home"),
    path("tenants/<slug:slug>/", views.tenant_detail, name="tenant-detail"),
]
