from django.urls import path

from gpucap.notices import views

app_name = "notices"

urlpatterns = [
    path("", views.notice_list, name="list"),
]
