"""`Proxy`: clawray's ingress (FastAPI on Ray Serve): auth, sessions, skill and memory injection,
turn capture.

Routes (errors become status codes only here): OpenAI `POST /v1/chat/completions`, `POST /v1/responses`,
`GET /v1/models`; Anthropic `POST /v1/messages`, `POST /v1/messages/count_tokens` (the three generation
APIs side by side: serve/apis.py); `GET /healthz`; session end
`POST /v1/sessions/{id}/end`; the requester's own memory `GET|DELETE /v1/memory`; admin (own key)
`/admin/adapters…`, `/admin/sessions/stats`, `/admin/memory/…` (docs/memory.md). Generation happens in
the engine deployment (`PolicyEngine`: vLLM, or `UpstreamEngine`) behind a handle; this replica holds the
handle and a session store, no engine state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, RayServeException

from core import names
from core.agent_context import context_markers, latest_user_words
from core.config import ProxyConfig, SkillsConfig
from core.storage import StorageLayout
from memory import admin as mem
from memory.units import split_tenant
from serve.activity import ActivityReporter
from serve.apis import CHAT, MESSAGES, RESPONSES, Api
from serve.budget import OUTPUT_FIELDS, requested_output_tokens
from serve.context_manager import ContextManager
from serve.history import read_history
from serve.hot_routes import HotRoutes, register
from serve.http import (
    EventStream,
    LastEvent,
    anthropic_error,
    client_fingerprint,
    key_matches,
    openai_error,
    presented_key,
    read_json_body,
    with_retry_after,
)
from serve.injection import SkillInjector
from serve.memory_injection import MemoryInjector, run_admin
from serve.metrics import ProxyMetrics
from serve.outbox import ActorPoolSink, Dispatcher, JsonlTurnSink
from serve.protocol import EngineRequestError, Reply
from serve.recorder import GroupCommit
from serve.sessions import DB_FILE, SessionStore
from serve.side import SideRules
from serve.turns import RequestError, TurnMeta, extract_meta, turns_from_reply
from serve.validate import check_messages

log = logging.getLogger("clawray.proxy")
app = FastAPI(title="clawray proxy", version="0.1.0")
# The generation routes skip FastAPI's router (serve/hot_routes.py); they are also declared below as usual.
CHAT_PATH, MESSAGES_PATH, RESPONSES_PATH = "/v1/chat/completions", "/v1/messages", "/v1/responses"
app.add_middleware(HotRoutes, routes={CHAT_PATH: "http_chat_completions", MESSAGES_PATH: "http_messages",
                                      RESPONSES_PATH: "http_responses"})
TERMINAL = ("data: [DONE]", "event: message_stop", "event: response.completed")
# Ray Serve request-path settings for Proxy replicas (measured in benchmarks/proxy_overhead.py): run the
# FastAPI app and the handle router on the replica's own event loop instead of two extra threads, and
# buffer Serve's access-log lines. Our request path never blocks the loop (SQLite runs in a thread).
PROXY_REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
}
# The engine is gone or saturated: the client may retry (OpenAI/Anthropic SDKs retry 503 by themselves).
UNAVAILABLE = (RayActorError, BackPressureError, RayServeException)


class ProxyImpl:
    def __init__(self, engine: Any, proxy: dict, skills: dict, storage_root: str,
                 sink_actors: list[str] | None = None, memory: dict | None = None, state: dict | None = None,
                 blob_root: str | None = None, namespace: str = names.DEFAULT_NAMESPACE,
                 context: dict | None = None):
        self.engine = engine
        self.cfg = ProxyConfig.model_validate(proxy)
        self.side_rules = SideRules.build(self.cfg.side_markers, self.cfg.extra_side_markers, self.cfg.side_models)
        self.agent_markers = context_markers(self.cfg.agent_context_markers, self.cfg.extra_agent_context_markers)
        # Long sessions (serve/context_manager.py); `context`: cluster/serve_app.py `context_args`.
        self.context = ContextManager.from_args(self.cfg.context, context)  # None: the limit is unknown
        layout = StorageLayout(Path(storage_root)).ensure()
        self.store = SessionStore(layout.sessions / DB_FILE, state, storage_root=layout.root)
        self.recorder = GroupCommit(self.store)
        # `namespace`: the Ray namespace of the named actors it delivers and reports to (`ray.namespace`).
        sink = ActorPoolSink(sink_actors, namespace) if sink_actors else JsonlTurnSink(layout.sessions / "completed.jsonl")
        self.dispatcher = Dispatcher(self.store, sink, self.cfg.session_idle_timeout_s,
                                     retention_s=self.cfg.outbox_retention_s,
                                     max_failures=self.cfg.max_delivery_attempts)
        self.injector = SkillInjector.build(SkillsConfig.model_validate(skills), layout.skills, blob_root)
        self.memory = MemoryInjector.from_args(memory, layout.memory, state)  # None: memory off
        # Keys are read here, from the env vars the config names, so they never travel as arguments.
        self.api_key = os.environ.get(self.cfg.api_key_env) if self.cfg.api_key_env else None
        self.admin_key = os.environ.get(self.cfg.admin_key_env) or None
        self.activity = ActivityReporter(names.OMLS, namespace)
        self.metrics: ProxyMetrics | None = None  # set by the deployment (needs a Ray worker)
        self.headers: dict[str, str] = {}  # added to every generation reply (the replica id)
        self._stream_engine: Any = None
        self._started = False
        # Requests of this replica waiting on the engine: a turn recorded while none is commits in place on
        # the loop (serve/recorder.py `alone`); under load they share a commit in a thread instead.
        self._waiting = 0

    def _ensure_started(self) -> None:
        if not self._started:  # needs the replica's running loop, so not in __init__
            self._started = True
            self.dispatcher.start()
            if self.injector is not None:
                self.injector.start()
            if self.metrics is not None:
                asyncio.get_running_loop().create_task(self._flush_metrics())

    async def _flush_metrics(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.metrics.dead_letters(self.dispatcher.dead_lettered)
            self.metrics.flush()

    # ---- auth -------------------------------------------------------------------------------------

    def _auth(self, request: Request) -> None:
        if not key_matches(presented_key(request), self.api_key):
            raise RequestError("missing or invalid API key", 401)

    def _admin(self, request: Request) -> None:
        if self.admin_key is None:
            raise RequestError("admin routes are disabled: set the admin key (proxy.admin_key_env)", 403)
        if not key_matches(request.headers.get("x-admin-key"), self.admin_key):
            raise RequestError("missing or invalid admin key", 401)

    # ---- generation -------------------------------------------------------------------------------

    def _observe(self, route: str, status: int, t0: float) -> None:
        if self.metrics is not None:
            self.metrics.request(route, status, time.perf_counter() - t0)

    async def _prepare(self, body: dict[str, Any], request: Request, api: Api) -> tuple[TurnMeta, list, int, str]:
        view = api.view(body)  # what identity and injection read: the body, or Responses' chat view
        meta = extract_meta(body, {k.lower(): v for k, v in request.headers.items()},
                            client_fingerprint(request), view.get("messages"), self.side_rules)
        main = meta.turn_type.value == "main"
        room = None  # tokens skills and memory may take (None: the context length is unknown)
        if self.context is not None:  # a conversation longer than the context is fitted, before injection
            fitted = await self.context.fit(body, api.name, main)
            if fitted is not None:
                view = api.view(body)
                meta = dataclasses.replace(meta, context=fitted)
            room = self.context.injection_room(body, api.name)
        skills, generation, block = [], 0, ""
        if main:
            self.activity.note()
            mark = self.memory.mark(view, api.anthropic) if self.memory is not None else 0
            query = latest_user_words(view.get("messages"), self.agent_markers)  # the user's words, not tool results
            if self.injector is not None:
                fits = self.context.skill_fits(room) if room is not None else None
                skills, generation, block = await self.injector.inject_block(view, api.anthropic, fits, meta.tenant, query)
            if self.memory is not None:  # after skills: memory gets the budget they left
                ids, _ = await self.memory.inject(view, api.anthropic, meta.tenant, meta.session_id,
                                                  meta.memory_scope, mark, room, query)
                meta = dataclasses.replace(meta, memories=tuple(ids))
            api.apply_view(body, view)
        # The client's output-token limit, as asked: the engine clamps it to what fits (serve/budget.py).
        requested = requested_output_tokens(body, OUTPUT_FIELDS[api.name])
        return dataclasses.replace(meta, max_tokens_requested=requested), skills, generation, block

    async def _record(self, reply: Reply, meta: TurnMeta, skills: list[str], generation: int,
                      tool_calls: list[list[dict]], block: str = "") -> None:
        cap = reply.capture
        if self.metrics is not None:
            self.metrics.captured(meta.turn_type.value, cap.prompt_count(),
                                  sum(len(c.token_ids) for c in cap.choices.values()))
        if meta.turn_type.value != "main":  # side turns are served, never stored or trained on
            if meta.session_done:
                await asyncio.to_thread(self.store.end_session, meta.session_id)
            return
        # A user whose request is still running is not away: a turn that outlasts OMLS's inactivity
        # threshold (a long generation on a slow engine) must not let a window open under it.
        self.activity.note()
        turns = turns_from_reply(reply, meta, skills, generation, tool_calls)
        if turns:  # the conversation the engine rendered: which stored turns it continues, and how
            await self.recorder.record(turns, read_history(reply.messages, meta.params), block,
                                       alone=self._waiting == 0, prompt=cap.prompt_bytes())

    async def generate(self, request: Request, anthropic: bool) -> Any:
        """A chat completions request, or with `anthropic` an Anthropic messages request."""
        return await self.handle(request, MESSAGES if anthropic else CHAT)

    async def handle(self, request: Request, api: Api) -> Any:
        """A generation request of any client API (serve/apis.py): checked, injected, served, captured."""
        self._ensure_started()
        t0 = time.perf_counter()
        route, error = api.name, api.error
        try:
            self._auth(request)
            body = await read_json_body(request, self.cfg.max_body_bytes)
            api.check(body)
            meta, skills, generation, block = await self._prepare(body, request, api)
            if body.get("stream"):
                return await self._stream(body, meta, skills, generation, api, t0, block)
            self._waiting += 1
            try:
                reply: Reply = await getattr(self.engine, api.name).remote(body)
            finally:
                self._waiting -= 1
            await self._record(reply, meta, skills, generation, api.tool_calls(reply.body), block)
        except RequestError as e:
            return self._failed(route, t0, error(e.status, str(e)))
        except EngineRequestError as e:
            return self._failed(route, t0, with_retry_after(error(e.status, e.message), e.retry_after_s))
        except UNAVAILABLE as e:
            log.warning("engine unavailable: %s", type(e).__name__)
            return self._failed(route, t0, error(503, "the engine is unavailable; retry shortly"))
        self._observe(route, 200, t0)
        return JSONResponse(reply.body, headers={**self.headers, "X-Session-Id": meta.session_id})

    def _failed(self, route: str, t0: float, response: JSONResponse) -> JSONResponse:
        self._observe(route, response.status_code, t0)
        return response

    async def _stream(self, body: dict, meta: TurnMeta, skills: list[str], generation: int,
                      api: Api, t0: float, block: str = "") -> EventStream:
        route = api.name
        if self._stream_engine is None:
            self._stream_engine = self.engine.options(stream=True)
        gen = getattr(self._stream_engine, f"{api.name}_stream").remote(body)
        first = await gen.__anext__()  # request errors surface here, before any byte is sent
        tools = api.stream_tools(body)

        async def events():
            item, held, status = first, None, 499  # 499 until the end: the client may go away first
            self._waiting += 1  # counted from here: a generator never started has no `finally` to undo it
            waiting = True
            try:
                while True:
                    if isinstance(item, Reply):
                        self._waiting, waiting = self._waiting - 1, False
                        n = len(item.capture.choices)
                        await self._record(item, meta, skills, generation, tools.result(n) if tools else [], block)
                        status = 200
                        break
                    if tools is not None:
                        tools.feed(item)  # the terminal event too: a Responses stream's holds the reply
                    if item.startswith(TERMINAL):
                        held = item  # sent only once the turn is recorded: the next turn must find it
                    else:
                        yield item
                    item = await gen.__anext__()
            except StopAsyncIteration:
                status = 200
            except (EngineRequestError, *UNAVAILABLE) as e:  # failed mid-stream: tell the client in-band
                status = e.status if isinstance(e, EngineRequestError) else 503
                message = e.message if isinstance(e, EngineRequestError) else "the engine became unavailable"
                log.warning("stream failed after it started: %s", type(e).__name__)
                yield api.stream_error(status, message)
            finally:
                if waiting:
                    self._waiting -= 1
                if status == 499:
                    gen.cancel()  # the client went away: stop generating
                self._observe(route, status, t0)
            if held is not None and status == 200:
                yield LastEvent(held)  # with the response's end, in one write (serve/http.py EventStream)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Session-Id": meta.session_id,
                   **self.headers}
        return EventStream(events(), media_type="text/event-stream", headers=headers)


@serve.deployment(name=names.PROXY, max_ongoing_requests=512)
@serve.ingress(app)
class Proxy(ProxyImpl):
    """Route handlers are named `http_*` / `admin_*` so that a co-located replica (serve/colocated.py) can
    also offer the engine's handle methods (`load_adapter`, `activate`, ...) under their own names."""

    def __init__(self, *args: Any, **kwargs: Any):
        ProxyImpl.__init__(self, *args, **kwargs)
        self.metrics = ProxyMetrics()
        if self.memory is not None:
            self.memory.enable_metrics()
        self.headers = {"X-Clawray-Replica": serve.get_replica_context().replica_id.unique_id}
        register(self)

    @app.post(CHAT_PATH)
    async def http_chat_completions(self, request: Request):
        return await self.generate(request, anthropic=False)

    @app.post(MESSAGES_PATH)
    async def http_messages(self, request: Request):
        return await self.generate(request, anthropic=True)

    @app.post(RESPONSES_PATH)
    async def http_responses(self, request: Request):
        return await self.handle(request, RESPONSES)

    @app.post("/v1/messages/count_tokens")
    async def http_count_tokens(self, request: Request):
        t0 = time.perf_counter()
        try:
            self._auth(request)
            body = await read_json_body(request, self.cfg.max_body_bytes)
            check_messages(body)
            extract_meta(body, {}, "")  # strips clawray's body fields
            result = await self.engine.count_tokens.remote(body)
        except RequestError as e:
            return self._failed("count_tokens", t0, anthropic_error(e.status, str(e)))
        except EngineRequestError as e:
            return self._failed("count_tokens", t0, anthropic_error(e.status, e.message))
        except UNAVAILABLE:
            return self._failed("count_tokens", t0, anthropic_error(503, "the engine is unavailable"))
        self._observe("count_tokens", 200, t0)
        return JSONResponse(result)

    @app.get("/v1/models")
    async def http_models(self, request: Request):
        try:
            self._auth(request)
            info = await self.engine.models.remote()
        except RequestError as e:
            return openai_error(e.status, str(e))
        except UNAVAILABLE:
            return openai_error(503, "the engine is unavailable")
        now = int(time.time())
        ids = list(dict.fromkeys([info["base"], info["alias"], *info["loaded"]]))
        data = [{"id": i, "object": "model", "created": now, "owned_by": "clawray",
                 "max_model_len": info["max_model_len"],
                 **({"active": info["active"]} if i == info["alias"] else {})} for i in ids]
        return {"object": "list", "data": data}

    @app.get("/healthz")
    async def http_healthz(self):
        self._ensure_started()
        try:
            info = await asyncio.wait_for(self.engine.models.remote(), 5)
        except Exception as e:  # noqa: BLE001 - any engine failure means "unhealthy", reported not raised
            return JSONResponse({"status": "unhealthy", "engine": type(e).__name__}, 503, headers=self.headers)
        return JSONResponse({"status": "ok", "active_adapter": info["active"],
                             "outbox": self.dispatcher.dispatched}, headers=self.headers)

    @app.post("/v1/sessions/{session_id}/end")
    async def http_end_session(self, session_id: str, request: Request):
        try:
            self._auth(request)
        except RequestError as e:
            return openai_error(e.status, str(e))
        n = await asyncio.to_thread(self.store.end_session, session_id)
        return {"session_id": session_id, "flushed": n}

    # ---- admin --------------------------------------------------------------------------------------

    async def _admin_call(self, request: Request, method: str, *args: Any):
        try:
            self._admin(request)
            return JSONResponse(await getattr(self.engine, method).remote(*args))
        except RequestError as e:
            return openai_error(e.status, str(e))
        except EngineRequestError as e:
            return openai_error(e.status, e.message)
        except UNAVAILABLE:
            return openai_error(503, "the engine is unavailable")

    @app.get("/admin/adapters")
    async def admin_list_adapters(self, request: Request):
        return await self._admin_call(request, "adapters")

    @app.post("/admin/adapters/{name}/load")
    async def admin_load_adapter(self, name: str, request: Request):
        return await self._admin_call(request, "load_adapter", name)

    @app.post("/admin/adapters/{name}/activate")
    async def admin_activate_adapter(self, name: str, request: Request):
        return await self._admin_call(request, "activate", None if name == "base" else name)

    @app.delete("/admin/adapters/{name}")
    async def admin_unload_adapter(self, name: str, request: Request):
        return await self._admin_call(request, "unload", name)

    @app.get("/admin/sessions/stats")
    async def admin_session_stats(self, request: Request):
        try:
            self._admin(request)
        except RequestError as e:
            return openai_error(e.status, str(e))
        return await asyncio.to_thread(self.store.stats)

    # ---- admin: long-term memory (memory/admin.py; `clawray memory ...` does the same on the files) -------

    async def _memory_call(self, request: Request, fn: Any) -> Any:
        try:
            self._admin(request)
            return await run_admin(self.memory, fn)
        except RequestError as e:
            return openai_error(e.status, str(e))
        except mem.AdminError as e:
            return openai_error(e.status, str(e))

    async def _own_memory(self, request: Request, fn: Any) -> Any:
        """`fn(store, user, workspace, session)` for the requester's own ids (API key, X-User-Id, ...)."""
        try:
            self._auth(request)
            meta = extract_meta({}, {k.lower(): v for k, v in request.headers.items()}, "")
            user, workspace = split_tenant(meta.tenant)
            session = request.headers.get("x-session-id")
            return await run_admin(self.memory, lambda store, _: fn(store, user, workspace, session))
        except RequestError as e:
            return openai_error(e.status, str(e))
        except mem.AdminError as e:
            return openai_error(e.status, str(e))

    @app.get("/v1/memory")
    async def http_memory(self, request: Request, limit: int = 100, offset: int = 0):
        """What clawray remembers about the requesting user (X-User-Id), all workspaces."""
        return await self._own_memory(request, lambda store, user, ws, sess: mem.list_units(
            store, mem.unit_filter(user), limit, offset))

    @app.delete("/v1/memory")
    async def http_forget_memory(self, request: Request, scope: str = "user"):
        """The requesting user forgets themself (`scope=user`), this workspace or this session (X-Session-Id)."""
        if scope not in ("user", "workspace", "session"):
            return openai_error(400, "scope must be user, workspace or session")

        def forget(store, user, ws, sess):
            if scope == "session" and not sess:
                raise mem.AdminError("forgetting a session needs X-Session-Id")
            return mem.forget(store, user, ws if scope != "user" else None, sess if scope == "session" else None)

        return await self._own_memory(request, forget)

    @app.get("/admin/memory/units")
    async def admin_memory_list(self, request: Request, user: str | None = None, workspace: str | None = None,
                                session: str | None = None, level: str | None = None, kind: str | None = None,
                                superseded: bool = False, limit: int = 100, offset: int = 0):
        return await self._memory_call(request, lambda store, _: mem.list_units(
            store, mem.unit_filter(user, workspace, session, level, kind, superseded), limit, offset))

    @app.get("/admin/memory/units/{unit_id}")
    async def admin_memory_show(self, unit_id: str, request: Request):
        return await self._memory_call(request, lambda store, _: mem.show(store, unit_id))

    @app.delete("/admin/memory/units/{unit_id}")
    async def admin_memory_delete(self, unit_id: str, request: Request):
        return await self._memory_call(request, lambda store, _: mem.forget(store, None, unit_id=unit_id))

    @app.post("/admin/memory/forget")
    async def admin_memory_forget(self, request: Request):
        """Body: {"user": ..., "workspace"?: ..., "session"?: ...}: everything of that owner, for good."""
        try:
            body = await read_json_body(request, self.cfg.max_body_bytes)
        except RequestError as e:
            return openai_error(e.status, str(e))
        ids = {k: body.get(k) for k in ("user", "workspace", "session")}
        if not all(v is None or isinstance(v, str) for v in ids.values()):
            return openai_error(400, "user, workspace and session must be strings")
        return await self._memory_call(request, lambda store, _: mem.forget(store, **ids))

    @app.post("/admin/memory/search")
    async def admin_memory_search(self, request: Request):
        """Body: {"query", "user", "workspace", "session"?, "scope"?}: what such a request would be given."""
        try:
            body = await read_json_body(request, self.cfg.max_body_bytes)
        except RequestError as e:
            return openai_error(e.status, str(e))
        args = [body.get(k) for k in ("query", "user", "workspace")]
        if not all(isinstance(v, str) and v for v in args):
            return openai_error(400, "query, user and workspace are required strings")
        return await self._memory_call(request, lambda _, search: mem.search(
            search, *args, str(body.get("session") or "-"), str(body.get("scope") or "user")))

    @app.get("/admin/memory/export")
    async def admin_memory_export(self, request: Request, user: str | None = None, workspace: str | None = None,
                                  session: str | None = None):
        """JSON lines of every unit of the owner (superseded history included)."""
        def lines(store, _):
            flt = mem.unit_filter(user, workspace, session, include_superseded=True)
            return "".join(json.dumps(row) + "\n" for row in mem.export(store, flt))

        out = await self._memory_call(request, lines)
        return out if isinstance(out, JSONResponse) else PlainTextResponse(out, media_type="application/x-ndjson")

    @app.get("/admin/memory/stats")
    async def admin_memory_stats(self, request: Request):
        return await self._memory_call(request, lambda store, _: store.stats())


@app.exception_handler(Exception)
async def _internal(request: Request, exc: Exception):  # never leak stack traces or upstream details
    log.error("unhandled %s on %s", type(exc).__name__, request.url.path)
    return openai_error(500, "internal error")
