"""`clawray`: setup, start, stop, status, train-step, config, skills, dlq, report, agents (`demo` is mounted by
harness/cli.py).

Errors are one clear line plus a hint (exit code 2), never a traceback.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from core import names
from core.config import REPO_ROOT, ClawrayConfig, ConfigError, config_from_dict, load_config

# Ray reads its auth mode when it is first imported: the clusters `clawray start` runs use token auth.
os.environ.setdefault("RAY_AUTH_MODE", "token")

app = typer.Typer(add_completion=False, no_args_is_help=True, help="clawray: an agent that improves from use.")
config_app = typer.Typer(no_args_is_help=True, help="Show, read or change the config file.")
app.add_typer(config_app, name="config")
console = Console()
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="config YAML (default configs/local.yaml)")]


class CLIError(Exception):
    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


def _cfg(path: Path | None) -> ClawrayConfig:
    return load_config(path)


def _connect(cfg: ClawrayConfig) -> None:
    import ray

    from cluster.head import cluster_address
    from cluster.runtime import runtime_env_vars

    addr = cluster_address(cfg)
    if addr is None:
        raise CLIError("clawray is not running", "start it with `clawray start`")
    for k, v in runtime_env_vars(cfg).items():
        os.environ.setdefault(k, v)
    if not ray.is_initialized():
        ray.init(address=addr, namespace=cfg.ray.namespace, log_to_driver=False, configure_logging=False)


def _actor(cfg: ClawrayConfig, name: str):
    """The named actor in the config's namespace, or None when it is not running (one try)."""
    try:
        return names.actor(name, cfg.ray.namespace, timeout_s=0)
    except ValueError:
        return None


# ---- lifecycle ------------------------------------------------------------------------------------

@app.command()
def start(config: ConfigOpt = None) -> None:
    """Start (or join) Ray, deploy the Serve app and every actor, wait until healthy."""
    from cluster.head import start_head
    from cluster.runtime import runtime_env_vars
    from cluster.serve_app import ingress_env
    from cluster.system import start_system

    cfg = _cfg(config)
    with console.status("starting clawray…") as status:
        if cfg.ray.address is None:
            status.update("starting a local Ray head")
            ingress = ingress_env(cfg)
            info = start_head(cfg, {**runtime_env_vars(cfg), **ingress})
            os.environ.update(ingress)  # this process deploys the app: its checks see the head's ingress
            cfg = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": f"127.0.0.1:{info['port']}"})})
        system = start_system(cfg, detached=True, progress=lambda m: status.update(m))
    console.print(f"[green]clawray is up[/] (mode {cfg.scheduler.mode}): {system.base_url}/v1")
    console.print(f"  OpenAI base_url={system.base_url}/v1   Anthropic base_url={system.base_url}")


@app.command()
def stop(config: ConfigOpt = None) -> None:
    """Stop the Serve app, the actors and the local Ray head `start` launched."""
    from cluster.head import cluster_address, stop_head
    from cluster.system import stop_system

    cfg = _cfg(config)
    if cluster_address(cfg) is None:
        console.print("clawray is not running")
        return
    with console.status("stopping clawray…"):
        try:
            _connect(cfg)
            stop_system(cfg)
        finally:  # even if the cluster is unreachable, end the head we started
            stopped = stop_head(cfg) if cfg.ray.address is None else False
    console.print("[green]stopped[/]" + (" (local Ray head ended)" if stopped else ""))


def gather_status(cfg: ClawrayConfig) -> dict[str, Any]:
    """Every part's state, from the running cluster (each part reported even if another is down)."""
    import httpx
    import ray

    out: dict[str, Any] = {"mode": cfg.scheduler.mode}
    base = f"http://{'127.0.0.1' if cfg.proxy.host in ('0.0.0.0', '::') else cfg.proxy.host}:{cfg.proxy.port}"
    try:
        out["proxy"] = httpx.get(base + "/healthz", timeout=5).json() | {"url": base}
    except httpx.HTTPError as e:
        out["proxy"] = {"status": f"unreachable ({type(e).__name__})", "url": base}
    calls = {"omls": (names.OMLS, "state"), "skills": (names.EVOLVER, "stats"), "replay": (names.REPLAY, "stats"),
             "controller": (names.CONTROLLER, "status"), "memory": (names.MEMORY, "stats")}
    for key, (name, method) in calls.items():
        actor = _actor(cfg, name)
        try:
            out[key] = ray.get(getattr(actor, method).remote(), timeout=15) if actor else {"status": "not running"}
        except Exception as e:  # noqa: BLE001 - a dead part is reported, not fatal to status
            out[key] = {"status": f"error ({type(e).__name__})"}
    return out


@app.command()
def status(config: ConfigOpt = None, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Proxy health, mode, OMLS state and next window, skills, adapter, replay counts, last step."""
    cfg = _cfg(config)
    _connect(cfg)
    st = gather_status(cfg)
    if as_json:
        console.print_json(json.dumps(st, default=str))
        return
    t = Table(title="clawray status", show_header=False)
    proxy, omls, sk, rp, ct = st["proxy"], st["omls"], st["skills"], st["replay"], st["controller"]
    t.add_row("proxy", f"{proxy.get('status')} at {proxy.get('url')}/v1")
    t.add_row("mode", st["mode"])
    t.add_row("OMLS", f"{omls.get('state', omls.get('status'))}; next window {omls.get('next_window')}")
    t.add_row("skills", f"generation {sk.get('generation', '?')}, {sk.get('skills', '?')} skills")
    t.add_row("adapter", str(proxy.get("active_adapter") or "base model"))
    t.add_row("replay", json.dumps(rp.get("by_state", rp)))
    mem = st["memory"]
    t.add_row("memory", f"{mem['units']} units {json.dumps(mem['by_kind'])}, {mem['inbox_pending']} turns pending"
              if "units" in mem else str(mem.get("status")))
    last = (ct.get("last_run") or {}) if isinstance(ct, dict) else {}
    t.add_row("training", f"running={ct.get('running')} runs={ct.get('runs')} last={last.get('stop_reason')} "
              f"steps={last.get('steps')}")
    lock = ct.get("run_lock") if isinstance(ct, dict) else None
    if lock:  # who trains now, whichever process started it (a window, a train-step, python -m train.job)
        t.add_row("run lock", f"{lock['holder']} (pid {lock['pid']} on {lock['host']}) since {lock['since']}")
    console.print(t)


@app.command("train-step")
def train_step(config: ConfigOpt = None, steps: Annotated[int, typer.Option(min=1)] = 1) -> None:
    """Run training steps now, on fresh samples of the current generation (outside any window)."""
    import ray

    cfg = _cfg(config)
    _connect(cfg)
    ctl = _actor(cfg, names.CONTROLLER)
    if ctl is None:
        raise CLIError("the Controller is not running", "start clawray with `clawray start`")
    with console.status(f"training {steps} step(s)…"):
        res = ray.get(ctl.train_step.remote(steps))
    if "event" not in res:  # refused: another run trains (one trainer at a time)
        raise CLIError(res["error"], "`clawray status` shows the run; try again when it has ended")
    console.print_json(json.dumps(res, default=str))
    if res.get("error"):
        raise CLIError(f"the training run failed: {res['error']}", "the Controller's log has the traceback")


# ---- config ---------------------------------------------------------------------------------------

def _get(data: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            raise CLIError(f"unknown config key {key!r}", "see `clawray config show`")
        data = data[part]
    return data


@config_app.command("show")
def config_show(config: ConfigOpt = None) -> None:
    console.print(yaml.safe_dump(_cfg(config).model_dump(mode="json"), sort_keys=False))


@config_app.command("get")
def config_get(key: str, config: ConfigOpt = None) -> None:
    console.print(json.dumps(_get(_cfg(config).model_dump(mode="json"), key)))


@config_app.command("set")
def config_set(key: str, value: str, config: ConfigOpt = None) -> None:
    """Set KEY (dotted) to VALUE (YAML scalar/list) in the config file, validating first."""
    path = Path(config or os.environ.get("CLAWRAY_CONFIG") or REPO_ROOT / "configs" / "local.yaml")
    data = yaml.safe_load(path.read_text()) or {}
    node = data
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = yaml.safe_load(value)
    config_from_dict(data, str(path))  # refuse before writing
    from core.storage import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
    console.print(f"{key} = {json.dumps(node[leaf])} in {path}")


@app.command()
def setup(
    out: Annotated[Path, typer.Option(help="config file to write")] = REPO_ROOT / "configs" / "my.yaml",
    model: Annotated[str | None, typer.Option(help="'tiny' or a model path / hub id")] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    mode: Annotated[str | None, typer.Option(help="skills_only | rl | auto")] = None,
    storage_root: Annotated[str | None, typer.Option()] = None,
    interactive: Annotated[bool, typer.Option("--interactive/--no-interactive")] = False,
) -> None:
    """Write a config file from flags (or prompts with --interactive), validated before writing."""
    base = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())
    ask = (lambda q, d: typer.prompt(q, default=d)) if interactive else (lambda q, d: d)
    base["model"]["path"] = model or ask("model (tiny or path/hub id)", base["model"]["path"])
    if base["model"]["path"] != "tiny":  # local.yaml's default temperature is for the random-weight tiny model
        base["engine"].pop("default_temperature", None)
    base["proxy"]["host"] = host or ask("proxy host", base["proxy"]["host"])
    base["proxy"]["port"] = int(port or ask("proxy port", base["proxy"]["port"]))
    base["scheduler"]["mode"] = mode or ask("mode (skills_only|rl|auto)", base["scheduler"]["mode"])
    base["storage_root"] = storage_root or ask("storage root", base["storage_root"])
    config_from_dict(base, str(out))
    from core.storage import atomic_write_text

    atomic_write_text(out, yaml.safe_dump(base, sort_keys=False))
    console.print(f"[green]wrote[/] {out}  (use it with `clawray start -c {out}`)")


@app.command()
def report(config: ConfigOpt = None, out: Annotated[Path | None, typer.Option()] = None) -> None:
    """A PNG: reward over time, skill generations, training windows and adapter versions."""
    from cluster.report import write_report

    cfg = _cfg(config)
    path = write_report(cfg.storage_path(), out or cfg.storage_path() / "report.png", cfg.state)
    console.print(f"[green]report[/] {path}")


# ---- dead letters -----------------------------------------------------------------------------------

dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters: turns that failed scoring N times (session "
                      "outbox) and samples the trainer rejected (replay buffer).")
app.add_typer(dlq_app, name="dlq")
EVERY_DEAD_LETTER = 1_000_000  # `dead_letters(limit)` when ids are checked: dead letters are few


@contextmanager
def _dead_letter_stores(cfg: ClawrayConfig) -> Iterator[dict[str, Any]]:
    """The two dead-letter stores, opened directly through the config's `state` (safe next to a running
    system: SQLite WAL, or PostgreSQL). An embedded store whose file does not exist yet holds none and is
    not created."""
    from core.storage import StorageLayout
    from serve.sessions import DB_FILE as SESSIONS_DB
    from serve.sessions import SessionStore
    from train.replay import DB_FILE as REPLAY_DB
    from train.replay_store import ReplayStore

    layout = StorageLayout(cfg.storage_path())
    state, shared = cfg.state.model_dump(), bool(cfg.state.dsn)
    stores: dict[str, Any] = {}
    try:
        if shared or (layout.sessions / SESSIONS_DB).is_file():
            stores["outbox"] = SessionStore(layout.sessions / SESSIONS_DB, state)
        if shared or (layout.replay / REPLAY_DB).is_file():
            stores["replay"] = ReplayStore(layout.replay / REPLAY_DB, state=state)
        yield stores
    finally:
        for store in stores.values():
            store.close()


@dlq_app.command("list")
def dlq_list(config: ConfigOpt = None, limit: Annotated[int, typer.Option(min=1, help="per store")] = 100,
             as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Dead letters of both stores, oldest first, with their last error."""
    with _dead_letter_stores(_cfg(config)) as stores:
        rows = [{"store": name, **row} for name, store in stores.items() for row in store.dead_letters(limit)]
    if as_json:
        console.print_json(json.dumps(rows, default=str))
        return
    if not rows:
        console.print("no dead letters")
        return
    t = Table(title=f"{len(rows)} dead letter(s)")
    for col in ("store", "id", "attempts", "at", "error"):
        t.add_column(col, overflow="fold")
    for r in rows:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["at"])) if r.get("at") else ""
        t.add_row(r["store"], r["id"], str(r.get("attempts", "")), at, escape(str(r.get("error") or ""))[:300])
    console.print(t)


def _dlq_apply(config: Path | None, ids: list[str], action: str) -> None:
    """`requeue` or `drop` on whichever store holds each id; refuses (changing nothing) on unknown ids."""
    with _dead_letter_stores(_cfg(config)) as stores:
        held = {name: {r["id"] for r in store.dead_letters(EVERY_DEAD_LETTER)} & set(ids)
                for name, store in stores.items()}
        unknown = sorted(set(ids).difference(*held.values()))
        if unknown:
            raise CLIError(f"not a dead letter: {', '.join(unknown)} (nothing was changed)",
                           "see `clawray dlq list` for the ids")
        done = {name: getattr(stores[name], action)(sorted(found)) for name, found in held.items() if found}
    console.print(f"{action}: " + ", ".join(f"{n} from the {name}" for name, n in done.items()))


@dlq_app.command("requeue")
def dlq_requeue(ids: Annotated[list[str], typer.Argument(help="dead-letter ids (`clawray dlq list`)")],
                config: ConfigOpt = None) -> None:
    """Put dead letters back: turns into the outbox (scored again), samples into the replay buffer."""
    _dlq_apply(config, ids, "requeue")


@dlq_app.command("drop")
def dlq_drop(ids: Annotated[list[str], typer.Argument(help="dead-letter ids (`clawray dlq list`)")],
             config: ConfigOpt = None) -> None:
    """Delete dead letters for good."""
    _dlq_apply(config, ids, "drop")


def _mount_skills() -> None:
    from cluster.skills_cli import mount
    from evolve.cli import skills_app

    mount(skills_app)  # the commands that need the running system: evolve --now, decisions
    app.add_typer(skills_app, name="skills", help="List, show, add, remove, roll back or evolve skills; "
                                                   "the change log.")


_mount_skills()


def _mount_memory() -> None:
    from evolve.embedding import SentenceEmbedder
    from memory.cli import memory_app, set_embedder_factory

    set_embedder_factory(SentenceEmbedder)  # the composition root hands memory/ its embedder
    app.add_typer(memory_app, name="memory", help="List, search, show, export or forget long-term memory.")


_mount_memory()


def _mount_state() -> None:
    from cluster.state_cli import state_app

    app.add_typer(state_app, name="state")


_mount_state()


def _mount_agents() -> None:
    from agents.cli import agents_app

    app.add_typer(agents_app, name="agents")


_mount_agents()


def main() -> None:
    # An error's text is printed as written (`escape`): a path or log line in brackets ("[/tmp/.../haproxy.cfg:45]")
    # is no markup tag, and read as one it crashed the printer itself (tests/unit/test_cli_errors.py).
    logging.basicConfig(level=logging.WARNING)
    try:
        code = app(standalone_mode=False)  # without standalone mode click returns an Exit's code
    except CLIError as e:
        console.print(f"[red]error:[/] {escape(str(e))}" + (f"\n[dim]hint: {escape(e.hint)}[/]" if e.hint else ""))
        raise SystemExit(2) from None
    except ConfigError as e:
        console.print(f"[red]config error:[/] {escape(str(e))}\n[dim]hint: fix the key named above, or see `clawray config show`[/]")
        raise SystemExit(2) from None
    except (typer.Abort, KeyboardInterrupt):
        raise SystemExit(130) from None
    except Exception as e:  # noqa: BLE001 - the CLI promise: one line, no traceback
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            raise SystemExit(e.exit_code) from None
        if isinstance(e, click.exceptions.Exit):
            raise SystemExit(e.exit_code) from None
        console.print(f"[red]error:[/] {type(e).__name__}: {escape(str(e))}\n[dim]hint: set CLAWRAY_DEBUG=1 for the traceback[/]")
        if os.environ.get("CLAWRAY_DEBUG"):
            raise
        raise SystemExit(1) from None
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
