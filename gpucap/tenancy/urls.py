from django.urls import path

from gpucap.tenancy import views

# No namespace: "home" is where LOGIN_REDIRECT_URL sends everyone after signing in.
urlpatterns = [
    path("", views.home, name="home"),
    path("tenants/", views.tenant_list, name="tenant-list"),
    path("tenants/<slug:slug>/", views.tenant_detail, name="tenant-detail"),
    path("tenants/<slug:slug>/members/", views.members, name="tenant-members"),
    path("tenants/<slug:slug>/members/invite/", views.member_invite, name="member-invite"),
    path("tenants/<slug:slug>/members/<int:pk>/role/", views.member_set_role, name="member-role"),
    path("tenants/<slug:slug>/members/<int:pk>/remove/", views.member_remove, name="member-remove"),
    path(
        "accounts/set-password/<uidb64>/<token>/",
        views.SetPasswordView.as_view(),
        name="set-password",
    ),
    path(
        "accounts/set-password/done/",
        views.SetPasswordDoneView.as_view(),
        name="set-password-done",
    ),
]
