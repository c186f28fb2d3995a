"""Wiring by name (issue 14 item 6): every Ray name from core/names.py, the namespace from the config, and
the one named-actor lookup (cached, retried while an actor is not there yet, re-resolved after it died).

The retry policy and the wiring are tested without Ray (fake lookups, a fake clock); three tests use a
real local Ray cluster (`ray_local`): an actor that appears while the lookup waits, one that dies and is
recreated, and the system's actors placed in a non-default namespace.
"""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from core import names
from core.config import REPO_ROOT, config_from_dict, load_config

TEST_NS = "clawray-test-ns"


def _cfg(tmp_path, **env: str):
    return load_config(REPO_ROOT / "configs" / "local.yaml",
                       env={"CLAWRAY__STORAGE_ROOT": str(tmp_path / "state"), **env})


@pytest.fixture
def lookups(monkeypatch):
    """`ray.get_actor` answering from `present` (a name missing there: Ray's ValueError), with a fake clock
    that the lookup's pauses advance; an empty handle cache."""
    import ray

    state = SimpleNamespace(present={}, calls=[], slept=[], now=0.0, arrive_after=None)

    def get_actor(name: str, namespace: str | None = None) -> Any:
        state.calls.append((name, namespace))
        if state.arrive_after is not None and len(state.calls) > state.arrive_after:
            state.present.setdefault(name, object())  # created while the lookup waited
        if name not in state.present:
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return state.present[name]

    def sleep(s: float) -> None:
        state.slept.append(s)
        state.now += s

    monkeypatch.setattr(ray, "get_actor", get_actor)
    monkeypatch.setattr(names, "_sleep", sleep)
    monkeypatch.setattr(names, "_clock", lambda: state.now)
    monkeypatch.setattr(names, "_CACHE", {})
    return state


# ------------------------------------------------------------------------------------------- the names
def test_names_derive_from_the_config_namespace_and_pool_size(tmp_path):
    cfg = _cfg(tmp_path, CLAWRAY__RAY__NAMESPACE="team-a", CLAWRAY__REWARDS__POOL_SIZE="3")
    system = names.names_for(cfg)
    assert system == names.Names("team-a", 3)
    assert system.prms == ["PRM-0", "PRM-1", "PRM-2"]
    assert system.actors == ["Replay", "Evolver", "Memory", "OMLS", "Controller", "PRM-0", "PRM-1", "PRM-2"]
    # The default stays `clawray`: the shipped profiles and the integration tests use it.
    assert names.names_for(_cfg(tmp_path)).namespace == names.DEFAULT_NAMESPACE == "clawray"


def test_the_serve_config_deploys_the_app_under_the_name_the_system_looks_for():
    """`serve run configs/serve.yaml` names the app itself; the Controller's start-up gate, the PRM's
    engine judge and the trainer's hot-swap find the engine under `names.APP`."""
    serve_cfg = yaml.safe_load((REPO_ROOT / "configs" / "serve.yaml").read_text())
    assert [a["name"] for a in serve_cfg["applications"]] == [names.APP]


@pytest.mark.parametrize("colocate", [False, True])
def test_every_serve_replica_is_handed_the_configured_namespace(colocate):
    """The Proxy (or the co-located engine) finds the PRM pool and OMLS in `ray.namespace`: Serve runs its
    replicas in Serve's own namespace, so the builder must hand it over."""
    from cluster.serve_app import build_colocated, build_proxy

    cfg = config_from_dict({"ray": {"namespace": TEST_NS}, "proxy": {"colocate": colocate}})
    app = build_colocated(cfg, ["PRM-0"]) if colocate else build_proxy(cfg, None, ["PRM-0"])
    assert app._bound_deployment.init_args[-2] == TEST_NS  # then the context args (serve_app.context_args)


def test_ensure_actors_creates_every_actor_in_the_configured_namespace(tmp_path, monkeypatch):
    """The composition root hands `ray.namespace` to every actor it starts, and to the names they use to
    find each other (the PRMs' Replay sink), so a non-default namespace works end to end."""
    import ray

    import cluster.controller
    import cluster.omls_actor
    import evolve.actor
    import memory.actor
    import rewards.pool
    import train.replay
    from cluster.system import ensure_actors

    class Handle:
        def __init__(self, **answers: Any):
            self.answers = answers

        def __getattr__(self, method: str):
            return SimpleNamespace(remote=lambda *a, **k: self.answers.get(method))

    seen: dict[str, Any] = {}

    def creator(name: str, handle: Any, namespace=lambda a, k: k["namespace"]):
        def create(*a: Any, **k: Any) -> Any:
            seen[name] = namespace(a, k)
            return handle
        return create

    def prm_pool(cfg, sink_factory, *a, **k):
        seen["PRM"], sink = k["namespace"], sink_factory()
        seen["PRM sink"] = (sink.name, sink.namespace)
        return [Handle() for _ in range(cfg.pool_size)]

    monkeypatch.setattr(ray, "get", lambda x, **k: x)
    monkeypatch.setattr(train.replay, "get_or_create_replay", creator("Replay", Handle(stats={"generation": 0})))
    monkeypatch.setattr(evolve.actor, "get_or_create_evolver", creator("Evolver", Handle(reconcile_generation=0)))
    monkeypatch.setattr(memory.actor, "get_or_create_memory", creator("Memory", Handle()))
    monkeypatch.setattr(rewards.pool, "start_prm_pool", prm_pool)
    monkeypatch.setattr(cluster.omls_actor, "start_omls", creator("OMLS", Handle()))
    monkeypatch.setattr(cluster.controller, "start_controller",
                        creator("Controller", Handle(), lambda a, k: (a[0].ray.namespace, k["serving_app"])))

    cfg = _cfg(tmp_path, CLAWRAY__RAY__NAMESPACE=TEST_NS, CLAWRAY__MEMORY__ENABLED="true")
    handles = ensure_actors(cfg, detached=False)
    assert seen == {"Replay": TEST_NS, "Evolver": TEST_NS, "Memory": TEST_NS, "PRM": TEST_NS,
                    "PRM sink": (names.REPLAY, TEST_NS), "OMLS": TEST_NS, "Controller": (TEST_NS, names.APP)}
    assert sorted(handles) == sorted(names.names_for(cfg).actors)


def _literals(path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in a Python file, f-string parts included."""
    import ast

    return [(n.lineno, n.value) for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_no_plane_spells_an_actor_or_deployment_name_itself():
    """Every actor/deployment name comes from core/names.py (DESIGN.md "Planes and folders")."""
    spelled = {names.REPLAY, names.EVOLVER, names.MEMORY, names.OMLS, names.CONTROLLER, names.PROXY, names.ENGINE}
    labels = {("cluster/cli.py", "OMLS")}  # a row label of `clawray status`, not a lookup
    found = [(str(f.relative_to(REPO_ROOT)), line, text)
             for plane in ("core", "serve", "rewards", "evolve", "train", "cluster", "memory", "harness")
             for f in sorted((REPO_ROOT / plane).rglob("*.py")) if f != REPO_ROOT / "core" / "names.py"
             for line, text in _literals(f)
             if text in spelled or text.startswith(("PRM-", "TrainControl-"))]
    assert [x for x in found if (x[0], x[2]) not in labels] == []


def test_the_composition_root_imports_nothing_above_it():
    """`cluster/` imports no `scripts/` (the Serve app's builder has no setup side effects: `make model`
    builds the tiny model), `harness/` or `benchmarks/`."""
    import ast

    above = ("scripts", "harness", "benchmarks")
    found = []
    for f in sorted((REPO_ROOT / "cluster").rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            mods = [a.name for a in n.names] if isinstance(n, ast.Import) else (
                [n.module or ""] if isinstance(n, ast.ImportFrom) else [])
            found += [(f.name, m) for m in mods if m.split(".")[0] in above]
    assert found == []


# --------------------------------------------------------------------------- the lookup (no Ray needed)
def test_the_backoff_doubles_from_the_first_pause_up_to_its_cap():
    assert [names.backoff_s(i, first_s=0.05, max_s=1.0) for i in range(7)] == [
        0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert names.backoff_s(10_000) == names.MAX_BACKOFF_S  # no overflow however long it waits


def test_the_lookup_retries_until_the_actor_appears(lookups):
    lookups.arrive_after = 3  # the fourth lookup finds it
    handle = names.actor("Replay", TEST_NS, timeout_s=10)
    assert handle is lookups.present["Replay"]
    assert lookups.slept == [0.05, 0.1, 0.2]
    assert lookups.calls == [("Replay", TEST_NS)] * 4


def test_the_lookup_gives_up_after_its_timeout_with_a_clear_error(lookups):
    with pytest.raises(names.ActorNotFoundError) as e:
        names.actor("OMLS", TEST_NS, timeout_s=1.0)
    assert "no Ray actor 'OMLS' in namespace 'clawray-test-ns' after 1 s" in str(e.value)
    assert isinstance(e.value, ValueError)  # what callers of ray.get_actor already catch
    assert lookups.slept == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.25])  # the last pause ends at the deadline
    lookups.calls.clear()
    with pytest.raises(names.ActorNotFoundError):
        names.actor("OMLS", TEST_NS, timeout_s=0)  # 0: one try, no pause
    assert len(lookups.calls) == 1 and len(lookups.slept) == 5


# ------------------------------------------------------------------------------ the lookup on real Ray
@pytest.fixture(scope="module")
def ray_local():
    """A local Ray cluster of our own (or the test session's, when one runs already)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}})
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def ns(ray_local):
    """A namespace of this test's own; its actors killed afterwards."""
    namespace = f"names-{uuid.uuid4().hex[:8]}"
    yield namespace
    for a in ray_local.util.list_named_actors(all_namespaces=True):
        if a["namespace"] != namespace:
            continue
        try:  # listed while it was dying (a test killed it): its name may be gone by now
            handle = ray_local.get_actor(a["name"], namespace=namespace)
        except ValueError:
            continue
        ray_local.kill(handle, no_restart=True)


class Echo:
    def __init__(self, tag: str):
        self.tag = tag

    def who(self) -> str:
        return self.tag


def _echo(ray, name: str, namespace: str, tag: str):
    return ray.remote(num_cpus=0)(Echo).options(name=name, namespace=namespace).remote(tag)


def test_a_real_lookup_waits_for_an_actor_created_while_it_waits(ray_local, ns, monkeypatch):
    made: list[Any] = []

    def sleep(s: float) -> None:  # the first pause: the actor is created meanwhile
        if not made:
            made.append(_echo(ray_local, "Late", ns, "late"))

    monkeypatch.setattr(names, "_sleep", sleep)
    handle = names.actor("Late", ns, timeout_s=60)
    assert made and ray_local.get(handle.who.remote(), timeout=60) == "late"
    assert names.actor("Late", ns) is handle  # cached


def _wait_dead(ray, name: str, ns: str, timeout_s: float = 60.0) -> None:
    """Until the GCS has released the dead actor's name (polled): it is dead for every caller then."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get_actor(name, namespace=ns)
        except ValueError:
            return
        assert time.monotonic() < deadline, "the killed actor never died"
        time.sleep(0.05)


def test_a_dead_actors_handle_is_dropped_and_its_new_incarnation_found(ray_local, ns):
    from ray.exceptions import RayActorError

    first = _echo(ray_local, "Flaky", ns, "first")
    handle = names.actor("Flaky", ns, timeout_s=60)
    assert ray_local.get(handle.who.remote(), timeout=60) == "first"
    ray_local.kill(first, no_restart=True)
    _wait_dead(ray_local, "Flaky", ns)  # ray.kill is asynchronous: a call sent at once could still reach the live actor
    with pytest.raises(RayActorError), names.forget_if_dead("Flaky", ns):
        ray_local.get(handle.who.remote(), timeout=60)
    assert names.cached("Flaky", ns) is None  # the next lookup resolves the name again
    second = _echo(ray_local, "Flaky", ns, "second")  # held: a non-detached actor lives while its creator's handle does
    again = names.actor("Flaky", ns, timeout_s=60)
    assert again._actor_id == second._actor_id != handle._actor_id
    assert ray_local.get(again.who.remote(), timeout=60) == "second"


def test_a_non_default_namespace_holds_the_systems_actors(ray_local, tmp_path):
    """The Replay and OMLS actors as the composition root creates them, for a config whose `ray.namespace`
    is not the default: they are found there, and only there; a Replay created anew replaces the handle
    the lookup cached."""
    from ray.exceptions import RayActorError

    from cluster.omls_actor import start_omls
    from core.storage import StorageLayout
    from train.replay import get_or_create_replay

    cfg = _cfg(tmp_path, CLAWRAY__RAY__NAMESPACE=TEST_NS)
    namespace = names.names_for(cfg).namespace
    layout = StorageLayout(cfg.storage_path()).ensure()
    replay = get_or_create_replay(cfg.replay, layout, namespace=namespace)
    omls = start_omls(cfg.scheduler, layout.root, namespace=namespace)
    try:
        assert ray_local.get(replay.stats.remote(), timeout=60)["generation"] == 0
        for name, handle in ((names.REPLAY, replay), (names.OMLS, omls)):
            assert ray_local.get_actor(name, namespace=TEST_NS)._actor_id == handle._actor_id
            assert names.actor(name, TEST_NS)._actor_id == handle._actor_id
            try:  # the default namespace holds none of them (the test session's own system may run there)
                other = ray_local.get_actor(name, namespace=names.DEFAULT_NAMESPACE)
            except ValueError:
                continue
            assert other._actor_id != handle._actor_id
        # Killed and created anew by this process: the lookup gives the new one, never the dead handle.
        ray_local.kill(replay, no_restart=True)
        with pytest.raises(RayActorError):  # ray.kill is asynchronous: a call may land before the actor is gone
            for _ in range(200):
                ray_local.get(replay.stats.remote(), timeout=60)
        replay = get_or_create_replay(cfg.replay, layout, namespace=namespace)
        assert names.actor(names.REPLAY, TEST_NS)._actor_id == replay._actor_id
    finally:
        for handle in (replay, omls):
            ray_local.kill(handle, no_restart=True)
        for name in (names.REPLAY, names.OMLS):
            names.forget(name, TEST_NS)
