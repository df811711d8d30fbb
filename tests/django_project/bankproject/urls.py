from __future__ import annotations

from bank import views
from django.urls import path

urlpatterns = [
    path("transfer", views.transfer_view),
    path("hold/<str:name>", views.hold_view),
    path("fail/<str:name>", views.fail_view),
]
