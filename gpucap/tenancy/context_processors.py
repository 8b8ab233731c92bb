from django.http import HttpRequest

from gpucap.roles import is_operator


def roles(request: HttpRequest) -> dict:
    return {"is_operator": is_operator(request.user)}
