"""The generation routes skip FastAPI's router (serve/hot_routes.py): the owner's handler answers them, and
everything else (other methods, paths, no owner yet) goes through FastAPI unchanged; an unexpected error
still gets the app's JSON 500."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from serve import hot_routes
from serve.hot_routes import HotRoutes, route_path


class Owner:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def chat(self, request: Request):
        body = await request.json()
        self.calls.append(body["q"])
        if body["q"] == "boom":
            raise RuntimeError("unexpected")
        return JSONResponse({"via": "hot", "q": body["q"]}, headers={"X-Test": "1"})


@pytest.fixture
def client(monkeypatch):
    monkeypatch.setattr(hot_routes, "_OWNER", {})
    app = FastAPI()
    app.add_middleware(HotRoutes, routes={"/v1/chat": "chat"})

    @app.post("/v1/chat")
    async def routed(request: Request):
        return JSONResponse({"via": "fastapi"})

    @app.get("/v1/chat")
    async def listed():
        return {"via": "fastapi-get"}

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        return JSONResponse({"error": "internal error"}, status_code=500)

    return TestClient(app, raise_server_exceptions=False)


def test_without_an_owner_fastapi_serves_the_route(client):
    assert client.post("/v1/chat", json={"q": "a"}).json() == {"via": "fastapi"}


def test_the_owner_answers_its_routes_and_nothing_else(client):
    owner = Owner()
    hot_routes.register(owner)
    r = client.post("/v1/chat", json={"q": "a"})
    assert r.json() == {"via": "hot", "q": "a"} and r.headers["x-test"] == "1"
    assert client.get("/v1/chat").json() == {"via": "fastapi-get"}  # another method
    assert client.post("/v1/chat/", json={"q": "b"}, follow_redirects=False).status_code == 307  # FastAPI's rule
    assert client.post("/v1/other", json={"q": "c"}).status_code == 404
    assert owner.calls == ["a"]


def test_an_unexpected_error_gets_the_apps_500(client):
    hot_routes.register(Owner())
    r = client.post("/v1/chat", json={"q": "boom"})
    assert r.status_code == 500 and r.json() == {"error": "internal error"}


def test_route_path_drops_serves_root_path():
    assert route_path({"path": "/app/v1/chat", "root_path": "/app"}) == "/v1/chat"
    assert route_path({"path": "/v1/chat", "root_path": ""}) == "/v1/chat"


def test_the_proxys_hot_routes_are_its_declared_post_routes():
    """The middleware's table and the FastAPI declarations name the same path and handler: a renamed
    handler or path would otherwise send requests to a method that is not that route's."""
    from fastapi.routing import APIRoute

    from serve.proxy import app

    (hot,) = [m.kwargs["routes"] for m in app.user_middleware if m.cls is HotRoutes]
    declared = {r.path: r.name for r in app.routes if isinstance(r, APIRoute) and "POST" in r.methods}
    assert hot and all(declared.get(path) == name for path, name in hot.items())
