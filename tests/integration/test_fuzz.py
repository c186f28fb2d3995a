"""Fuzzing the proxy: schemathesis-generated requests (>= 2,000, no 5xx, no crash) and hand-written hostile
inputs (path traversal, huge bodies, invalid UTF-8, bad headers, wrong auth: a clean 4xx, nothing changed).

The Proxy's routes read raw bodies, so FastAPI's `/openapi.json` has no body schemas; schemathesis runs
against a hand-written document of the routes (tests/integration/proxy_openapi.py), in positive (valid)
and negative (schema-violating) modes. Cases are generated first (Hypothesis, no shrinking: a failure is
reported with its curl line), then sent to 127.0.0.1 by a few threads so the run fits in a few minutes.
Hostile inputs that need an API key go to a second Serve app (`clawray-keyed`, route `/keyed`): one more
Proxy replica in front of the same engine and storage root, with a key and a 64 KiB body limit.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import ray
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.integration.loadgen import alive_pids, ingress_class
from tests.integration.proxy_openapi import proxy_openapi

pytestmark = pytest.mark.slow

KEY_ENV = "CLAWRAY_TEST_FUZZ_KEY"
KEY = "sk-clawray-fuzz-key"
os.environ.setdefault(KEY_ENV, KEY)  # before Ray starts (collection precedes fixtures): replicas inherit it
ADMIN = {"X-Admin-Key": os.environ.get("CLAWRAY_ADMIN_KEY", "test-admin-key")}
BODY_LIMIT = 64 * 1024
TARGET = 2000
# examples per (operation, mode); Hypothesis may stop early on small spaces, so the plan overshoots.
PLAN = {"POST /v1/chat/completions": (380, 260), "POST /v1/messages": (300, 200),
        "POST /v1/messages/count_tokens": (160, 110), "GET /v1/models": (60, 50), "GET /healthz": (60, 50),
        "POST /v1/sessions/{session_id}/end": (100, 60)}
ADMIN_EXAMPLES = (40, 30)  # per admin operation: with the right key (reaching the engine), and fuzzed keys


@pytest.fixture(scope="module")
def keyed(serve_app):
    from ray import serve

    from cluster.serve_app import build_proxy

    cfg = serve_app["config"].model_copy(deep=True)
    cfg.proxy.api_key_env, cfg.proxy.max_body_bytes, cfg.proxy.num_cpus = KEY_ENV, BODY_LIMIT, 0.25
    engine = serve.get_deployment_handle("PolicyEngine", app_name="clawray")
    serve.run(build_proxy(cfg, engine, [f"PRM-{i}" for i in range(cfg.rewards.pool_size)]),
              name="clawray-keyed", route_prefix="/keyed")
    yield serve_app["base_url"] + "/keyed"
    serve.delete("clawray-keyed")


# ---- generated requests ---------------------------------------------------------------------------------

def generate() -> list:
    """schemathesis cases for every operation of the document, positive and negative."""
    schema = schemathesis.openapi.from_dict(proxy_openapi())
    cases: list = []
    for result in schema.get_all_operations():
        op = result.ok()
        admin = op.path.startswith("/admin")
        plan = ADMIN_EXAMPLES if admin else PLAN[f"{op.method.upper()} {op.path}"]
        for mode, n in zip((GenerationMode.POSITIVE, GenerationMode.NEGATIVE), plan, strict=True):
            variants = [ADMIN, None] if admin else [None]
            for headers in variants:
                strategy = op.as_strategy(generation_mode=mode, headers=headers)

                @settings(max_examples=n, phases=[Phase.generate], database=None, deadline=None,
                          suppress_health_check=list(HealthCheck))
                @given(strategy)
                def collect(case):
                    cases.append(case)

                try:
                    collect()
                except Unsatisfiable:  # nothing left to vary (e.g. negative mode with the key fixed)
                    pass
    return cases


def cheap(case) -> None:
    """Keep generation small: a body that would make the engine generate many tokens (no `max_tokens`:
    up to the context length; moderate out-of-schema counts) gets the schema's maximum instead. Zero,
    negative, huge and wrongly typed values are still sent as generated."""
    body = case.body
    if not isinstance(body, dict) or "messages" not in body:
        return
    if body.get("max_tokens") is None:
        body["max_tokens"] = 4
    for key, top in (("max_tokens", 4), ("max_completion_tokens", 4), ("n", 2), ("top_logprobs", 5)):
        v = body.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and top < v < 1_000_000:
            body[key] = top


def send_all(cases: list, base: str, workers: int = 6) -> dict:
    """Send every case; statuses, cases the client library refused to send, and any 5xx/connection error."""
    local = threading.local()
    statuses: Counter = Counter()
    unsendable: Counter = Counter()
    errors: list[str] = []
    lock = threading.Lock()

    def one(case) -> None:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        cheap(case)
        try:
            r = case.call(base_url=base, session=local.session, timeout=120)
        except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, ValueError,
                UnicodeError) as e:  # the client library refuses to send it: not a request
            with lock:
                unsendable[type(e).__name__] += 1
            return
        except requests.exceptions.RequestException as e:  # no answer: the server crashed or hung
            with lock:
                errors.append(f"{type(e).__name__}\n  {case.as_curl_command(base_url=base)}")
            return
        with lock:
            statuses[r.status_code] += 1
            if r.status_code >= 500:
                errors.append(f"{r.status_code} {r.text[:200]}\n  {case.as_curl_command(base_url=base)}")

    pool = ThreadPoolExecutor(workers)
    try:
        for f in [pool.submit(one, c) for c in cases]:
            f.result()
    finally:
        pool.shutdown(cancel_futures=True)  # an interrupted run must not keep sending
    return {"statuses": statuses, "unsendable": unsendable, "server_errors": errors}


def test_schemathesis_2000_requests_no_5xx_no_crash(serve_app):
    base = serve_app["base_url"]
    pids = alive_pids(class_name=ingress_class(serve_app["config"]))
    t0 = time.time()
    cases = generate()
    t_gen = time.time() - t0
    out = send_all(cases, base)
    sent = sum(out["statuses"].values())
    print(f"\n[fuzz] generated {len(cases)} cases in {t_gen:.0f}s; sent {sent} in {time.time() - t0 - t_gen:.0f}s; "
          f"statuses {dict(sorted(out['statuses'].items()))}; not sendable {dict(out['unsendable'])}")
    assert sent >= TARGET, f"only {sent} requests were sent"
    assert not out["server_errors"], "\n".join(out["server_errors"][:5])
    assert httpx.get(base + "/healthz", timeout=10).status_code == 200
    assert alive_pids(class_name=ingress_class(serve_app["config"])) == pids, "the Proxy replica restarted during the fuzz"


# ---- hostile inputs: a clean 4xx, and nothing changed -----------------------------------------------------

def fingerprint(serve_app) -> dict:
    """Sessions DB counts, Replay's total, the engine's adapters, once the outbox is quiet."""
    from serve.sessions import SessionStore

    store = SessionStore(Path(serve_app["config"].storage_path()) / "sessions" / "sessions.db")
    replay = ray.get_actor("Replay", namespace="clawray")
    try:
        deadline, prev = time.time() + 90, None
        while time.time() < deadline:
            cur = {"sessions": store.stats(), "replay": ray.get(replay.stats.remote())["total"],
                   "adapters": httpx.get(serve_app["base_url"] + "/admin/adapters", headers=ADMIN).json()}
            if cur == prev and not cur["sessions"].get("completed"):
                return cur
            prev = cur
            time.sleep(1.5)
        raise AssertionError(f"the system did not settle: {prev}")
    finally:
        store.close()


def chunks(n: int):
    for _ in range(n // 4096 + 1):
        yield b"x" * 4096


def hostile(keyed: str, base: str) -> list[tuple[str, str, str, dict, object, int]]:
    """(what, method, url, headers, body, expected status)."""
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    auth = {"Authorization": f"Bearer {KEY}"}
    big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * BODY_LIMIT + b'"}]}'
    chat = keyed + "/v1/chat/completions"
    cases = [
        ("no API key", "POST", chat, {}, ok, 401),
        ("wrong Bearer key", "POST", chat, {"Authorization": "Bearer nope"}, ok, 401),
        ("wrong x-api-key", "POST", chat, {"x-api-key": "nope"}, ok, 401),
        ("key as Basic auth", "POST", chat, {"Authorization": f"Basic {KEY}"}, ok, 401),
        ("messages without key", "POST", keyed + "/v1/messages", {"x-api-key": "nope"}, ok, 401),
        ("count_tokens without key", "POST", keyed + "/v1/messages/count_tokens", {}, ok, 401),
        ("models without key", "GET", keyed + "/v1/models", {}, None, 401),
        ("session end without key", "POST", keyed + "/v1/sessions/s1/end", {}, {}, 401),
        ("body over the limit", "POST", chat, auth, big, 413),
        ("chunked body over the limit", "POST", chat, auth, chunks(BODY_LIMIT + 10), 413),
        ("body over the default 4 MiB", "POST", base + "/v1/chat/completions", {}, b"x" * (4 * 2**20 + 1), 413),
        ("invalid UTF-8", "POST", chat, auth, b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
        ("not JSON", "POST", chat, auth, b"{not json", 400),
        ("JSON array", "POST", chat, auth, b"[1, 2]", 400),
        ("empty body", "POST", chat, auth, b"", 400),
        ("no messages", "POST", chat, auth, {"model": "m"}, 400),
        ("messages not a list", "POST", chat, auth, {"model": "m", "messages": "hi"}, 400),
        ("X-Session-Id over 128 chars", "POST", chat, {**auth, "X-Session-Id": "s" * 129}, ok, 400),
        ("X-Session-Id not printable", "POST", chat, {**auth, "X-Session-Id": "a\x7fb"}, ok, 400),
        ("X-User-Id over 128 chars", "POST", chat, {**auth, "X-User-Id": "u" * 300}, ok, 400),
        ("bad X-Turn-Type", "POST", chat, {**auth, "X-Turn-Type": "bogus"}, ok, 400),
        ("bad X-Turn-Type (anthropic)", "POST", keyed + "/v1/messages", {**auth, "X-Turn-Type": "x"}, ok, 400),
        ("clawray_eval not an object", "POST", chat, auth, {**ok, "clawray_eval": "rm -rf /"}, 400),
    ]
    for method, path in (("GET", "/admin/adapters"), ("POST", "/admin/adapters/policy-v0001/load"),
                         ("POST", "/admin/adapters/base/activate"), ("DELETE", "/admin/adapters/policy-v0001"),
                         ("GET", "/admin/sessions/stats")):
        cases += [(f"{method} {path} without admin key", method, base + path, {}, None, 401),
                  (f"{method} {path} wrong admin key", method, base + path, {"X-Admin-Key": "nope"}, None, 401),
                  (f"{method} {path} API key as admin key", method, keyed + path, auth, None, 401)]
    for name in ("%2e%2e", "..%2F..%2Fetc%2Fpasswd", "policy-v0001%2F..%2F..%2F..%2Ftmp", "%2Fetc%2Fpasswd",
                 "policy-v0001%00"):
        cases += [(f"adapter name {name} (load)", "POST", f"{base}/admin/adapters/{name}/load", ADMIN, None, -4),
                  (f"adapter name {name} (activate)", "POST", f"{base}/admin/adapters/{name}/activate", ADMIN, None, -4),
                  (f"adapter name {name} (unload)", "DELETE", f"{base}/admin/adapters/{name}", ADMIN, None, -4)]
    return cases


def raw_http(url: str, head: str, body: bytes = b"") -> tuple[int, str]:
    """Send bytes no HTTP client would (e.g. a malformed Content-Length); (status, body text)."""
    import socket

    u = httpx.URL(url)
    with socket.create_connection((u.host, u.port), timeout=30) as s:
        s.sendall(f"{head}\r\nHost: {u.host}\r\nConnection: close\r\n\r\n".encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2].decode(errors="replace")


def _request(method: str, url: str, headers: dict, body: object) -> httpx.Response:
    kw: dict = {}
    if isinstance(body, dict):
        kw["json"] = body
    elif body is not None:
        kw["content"] = body
    # NOTE: httpx would percent-decode nothing, but it normalises '..' segments: URLs are sent as written.
    return httpx.request(method, httpx.URL(url), headers=headers, timeout=60, **kw)


def test_hostile_inputs_get_a_clean_4xx_and_change_nothing(keyed, serve_app):
    base = serve_app["base_url"]
    before = fingerprint(serve_app)
    wrong = []
    for what, method, url, headers, body, want in hostile(keyed, base):
        r = _request(method, url, headers, body)
        ok = (400 <= r.status_code < 500) if want == -4 else r.status_code == want
        clean = "Traceback" not in r.text and KEY not in r.text and ADMIN["X-Admin-Key"] not in r.text
        if not (ok and clean):
            wrong.append(f"{what}: {r.status_code} {r.text[:120]}")
    path = httpx.URL(keyed).path + "/v1/chat/completions"
    for what, head in (("invalid Content-Length", f"POST {path} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n"
                                                   "Content-Length: abc"),
                       ("negative Content-Length", f"POST {path} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n"
                                                    "Content-Length: -5")):
        status, text = raw_http(keyed, head, b"{}")
        if not 400 <= status < 500 or "Traceback" in text:
            wrong.append(f"{what}: {status} {text[:120]}")
    after = fingerprint(serve_app)
    print(f"\n[hostile] {len(hostile(keyed, base)) + 2} inputs; state before {before}\n  after {after}")
    assert not wrong, "\n".join(wrong)
    assert after == before


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


TRAVERSAL_NAMES = ["../../pwned", "../pwned", "..", "/tmp/pwned", "a/../../pwned", "skills/../../pwned",
                   "..\\..\\pwned", "%2e%2e%2fpwned", "\u2025/pwned", "pwned\x00x"]


@pytest.mark.parametrize("name", TRAVERSAL_NAMES)
def test_path_traversal_in_skill_names_is_refused_by_cli_and_bank(name, tmp_path):
    from typer.testing import CliRunner

    from cluster.cli import app
    from core.config import SkillsConfig
    from core.contracts import Skill
    from evolve.bank import BankError, SkillBank

    root = tmp_path / "state"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"storage_root: {root}\n")
    good = tmp_path / "in" / "keep-me"
    good.mkdir(parents=True)
    (good / "SKILL.md").write_text("---\nname: keep-me\ndescription: a skill that must survive\n---\nbody\n")
    runner = CliRunner()
    assert runner.invoke(app, ["skills", "--config", str(cfg), "add", str(good)]).exit_code == 0
    evil = tmp_path / "in" / "evil.md"
    evil.write_text(f"---\nname: {name!r}\ndescription: traversal\n---\nbody\n".replace("'", '"'))
    snapshot = _tree(tmp_path)
    for args in (["add", str(evil)], ["show", name], ["remove", name]):
        r = runner.invoke(app, ["skills", "--config", str(cfg), *args])
        assert r.exit_code != 0 and "Traceback" not in r.output, (args, r.output)
    bank = SkillBank(root / "skills", SkillsConfig())
    with pytest.raises((ValueError, BankError)):
        bank.add(Skill(name=name, description="x", body="y"))
    with pytest.raises(BankError):
        bank.remove(name)
    assert bank.get(name) is None and bank.names() == ["keep-me"]
    assert _tree(tmp_path) == snapshot, "a refused traversal changed files"
    assert not list(tmp_path.parent.rglob("pwned*")) and not Path("/tmp/pwned").exists()
