"""The generation routes go straight to the replica's handler, ahead of FastAPI's router (ASGI middleware).

Why hand-written: for a route that takes a `Request` and returns a Starlette response, FastAPI's exception
middleware, router (a regex per route until one matches), request/response wrappers and dependency solving
(the class-based view's `self`) are per-request work with nothing to do (~0.05-0.1 ms of a ~1.7 ms path,
benchmarks/whole_path.py). Every other route, method and path, and any request that arrives before the
replica has registered itself, goes through FastAPI as before. Errors are what they are on FastAPI's path:
the handlers turn request and engine errors into responses themselves, and anything unexpected reaches
Starlette's ServerErrorMiddleware (outside this one), which answers with the app's 500 handler.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

# The replica object whose methods serve the routes: one per Serve replica process, set by its constructor.
_OWNER: dict[str, Any] = {}


def register(owner: Any) -> None:
    _OWNER["replica"] = owner


def route_path(scope: Scope) -> str:
    """The path the app routes on: without the root path Serve sets for a route prefix."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class HotRoutes:
    """`routes`: POST path -> the name of the owner's method that takes the Request and returns a response."""

    def __init__(self, app: ASGIApp, routes: dict[str, str]) -> None:
        self.app, self.routes = app, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        owner = _OWNER.get("replica")
        if owner is not None and scope["type"] == "http" and scope["method"] == "POST":
            name = self.routes.get(route_path(scope))
            if name is not None:
                response = await getattr(owner, name)(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
