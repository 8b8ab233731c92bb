from django.urls import path

from gpucap.portal import views

# No namespace: "home" is where LOGIN_REDIRECT_URL sends everyone after signing in.
urlpatterns = [
    path("", views.home, name="home"),
    path("tenants/", views.tenant_list, name="tenant-list"),
    path("tenants/<slug:slug>/", views.tenant_detail, name="tenant-detail"),
]
