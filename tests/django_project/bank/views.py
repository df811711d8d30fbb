"""Views, each run in a transaction (ATOMIC_REQUESTS)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from tierlock.contrib.django import locks

from . import services


def transfer_view(request: HttpRequest) -> HttpResponse:
    post = request.POST
    services.transfer(int(post["src"]), int(post["dst"]), int(post["amount"]))
    return HttpResponse("done")


def hold_view(request: HttpRequest, name: str) -> HttpResponse:
    """Calls a service that holds ``hold:<name>``; says whether the request still holds
    it once the service has returned."""
    services.hold(name)
    return JsonResponse({"owned": locks.lock(f"hold:{name}").owned()})


class Refused(Exception):
    pass


def fail_view(request: HttpRequest, name: str) -> HttpResponse:
    """Holds ``hold:<name>`` through the service, then fails: the request rolls back."""
    services.hold(name)
    raise Refused(name)
