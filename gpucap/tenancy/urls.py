from django.urls import path

from gpucap.tenancy import views

urlpatterns = [
    path("tenants/<slug:slug>/members/", views.members, name="tenant-members"),
    path("tenants/<slug:slug>/members/invite/", views.member_invite, name="member-invite"),
    path("tenants/<slug:slug>/members/<int:pk>/role/", views.member_set_role, name="member-role"),
    path("tenants/<slug:slug>/members/<int:pk>/remove/", views.member_remove, name="member-remove"),
    path(
        "tenants/<slug:slug>/invitations/<int:pk>/revoke/",
        views.invitation_revoke,
        name="invitation-revoke",
    ),
    path("invitations/<str:token>/", views.invitation_accept, name="invitation-accept"),
    path("accounts/password-reset/", views.PasswordResetView.as_view(), name="password-reset"),
    path(
        "accounts/password-reset/sent/",
        views.PasswordResetSentView.as_view(),
        name="password-reset-sent",
    ),
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
