"""`clawray agents`: each agent's config edit (expected keys, unrelated and sandbox/approval keys kept),
byte-exact restore, idempotent setup, unknown formats refused with the file untouched. Temporary HOME;
no agent CLI needed (tests/integration/test_agents_config.py runs the real ones)."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from agents import apply, formats
from agents.cli import agents_app
from agents.registry import AGENTS, get
from agents.target import PLACEHOLDER_KEY, Target, client_host, target_from_config
from core.config import config_from_dict

T = Target(origin="http://127.0.0.1:8123", api_key=PLACEHOLDER_KEY, key_env=None, model="clawray-policy",
           context_window=32768, headers={"X-User-Id": "alice"})
TK = Target(origin="http://127.0.0.1:8123", api_key="sekrit", key_env="CLAWRAY_API_KEY",
            model="clawray-policy", context_window=32768, headers={"X-User-Id": "alice"})
URL = "http://127.0.0.1:8123/v1"

# One existing config per agent with unrelated keys and its sandbox / permission / approval settings,
# in the agent's own format, and the paths (into the parsed file) that setup must leave exactly as they are.
EXISTING = {
    "claude-code": (".claude/settings.json", json.dumps({
        "permissions": {"allow": ["Bash(ls:*)"], "deny": ["Read(./.env)"], "defaultMode": "acceptEdits"},
        "sandbox": {"enabled": True, "autoAllowBashIfSandboxed": False},
        "env": {"FOO": "bar", "ANTHROPIC_API_KEY": "sk-ant-users-own"}, "theme": "dark"}, indent=4),
        [("permissions",), ("sandbox",), ("env", "FOO"), ("theme",)]),
    "codex": (".codex/config.toml", """# my codex settings
model = "gpt-5"  # the old model
approval_policy = "on-request"
sandbox_mode = "workspace-write"

[sandbox_workspace_write]
network_access = false  # keep this

[mcp_servers.docs]
command = "docs-mcp"
args = ["--port", "3000"]

[model_providers.openai-proxy]
name = "other"
base_url = "https://proxy.example/v1"
""", [("approval_policy",), ("sandbox_mode",), ("sandbox_workspace_write",), ("mcp_servers",),
      ("model_providers", "openai-proxy")]),
    "openclaw": (".openclaw/openclaw.json", json.dumps({
        "agents": {"defaults": {"sandbox": {"mode": "all"}, "model": {"primary": "anthropic/x",
                                                                      "fallbacks": ["openai/y"]}}},
        "tools": {"exec": {"timeoutSeconds": 60}, "elevated": {"enabled": False}},
        "models": {"mode": "replace", "providers": {"other": {"baseUrl": "https://o.example/v1"}}},
        "gateway": {"port": 19001}}),
        [("agents", "defaults", "sandbox"), ("agents", "defaults", "model", "fallbacks"), ("tools",),
         ("models", "mode"), ("models", "providers", "other"), ("gateway",)]),
    "hermes": (".hermes/config.yaml", """# hermes
model:
  default: anthropic/claude-opus
  provider: openrouter
  base_url: https://openrouter.ai/api/v1
terminal:
  backend: docker
approvals:
  mode: manual
toolsets: [hermes-cli]
""", [("terminal",), ("approvals",), ("toolsets",)]),
    "copaw": (".copaw.secret/providers/active_model.json",
              json.dumps({"provider_id": "openai", "model": "gpt-5"}), []),
    "qwen-code": (".qwen/settings.json", json.dumps({
        "tools": {"approvalMode": "default", "sandbox": True},
        "modelProviders": {"openai": [{"id": "qwen3-coder", "baseUrl": "https://dashscope.example/v1",
                                       "envKey": "DASHSCOPE_API_KEY"}]},
        "ui": {"theme": "GitHub"}}),
        [("tools",), ("ui",)]),
}


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _load(path: Path):
    text = path.read_text()
    return {".json": json.loads, ".yaml": yaml.safe_load, ".toml": tomllib.loads}[path.suffix](text)


def _written(home: Path, agent: str, target: Target = T) -> dict[str, object]:
    return {f.path.name: _load(f.path) if f.fmt != "env" else formats.load("env", f.path.read_text())
            for f in get(agent).files(home, {}, target) if f.path.exists()}


def _check_points_at_clawray(agent: str, docs: dict, target: Target = T) -> None:
    """The keys that route the agent's model traffic name clawray's URL, model, key and headers."""
    if agent == "claude-code":
        env = docs["settings.json"]["env"]
        assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"  # no /v1: the SDK appends /v1/messages
        assert env["ANTHROPIC_AUTH_TOKEN"] == target.api_key and env["ANTHROPIC_MODEL"] == "clawray-policy"
        assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "clawray-policy"  # background turns stay on clawray
        assert env["ANTHROPIC_CUSTOM_HEADERS"] == "X-User-Id: alice"
        assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192" and "ANTHROPIC_API_KEY" not in env
    elif agent == "codex":
        cfg = docs["config.toml"]
        prov = cfg["model_providers"][cfg["model_provider"]]
        assert cfg["model"] == "clawray-policy" and cfg["model_context_window"] == 32768
        assert prov["base_url"] == URL and prov["wire_api"] == "responses"
        assert prov["http_headers"] == {"X-User-Id": "alice"}
        assert prov.get("env_key") == target.key_env
    elif agent == "openclaw":
        cfg = docs["openclaw.json"]
        assert cfg["agents"]["defaults"]["model"]["primary"] == "clawray/clawray-policy"
        prov = cfg["models"]["providers"]["clawray"]
        assert prov["baseUrl"] == URL and prov["api"] == "openai-completions"
        assert prov["headers"] == {"X-User-Id": "alice"}
        assert prov["models"][0]["id"] == "clawray-policy" and prov["models"][0]["contextWindow"] == 32768
    elif agent == "hermes":
        cfg = docs["config.yaml"]
        assert cfg["model"]["provider"] == "custom:clawray" and cfg["model"]["default"] == "clawray-policy"
        assert "base_url" not in cfg["model"]  # it would route around the provider
        prov = cfg["providers"]["clawray"]
        assert prov["base_url"] == URL and prov["extra_headers"] == {"X-User-Id": "alice"}
        assert prov["api_mode"] == "chat_completions" and prov["context_length"] == 32768
    elif agent == "copaw":
        assert docs["clawray.json"]["base_url"] == URL
        assert docs["clawray.json"]["extra_models"] == [{"id": "clawray-policy", "name": "clawray-policy"}]
        assert docs["active_model.json"] == {"provider_id": "clawray", "model": "clawray-policy"}
    elif agent == "qwen-code":
        cfg = docs["settings.json"]
        ours = cfg["modelProviders"]["openai"][0]
        assert ours["id"] == "clawray-policy" and ours["baseUrl"] == URL
        assert ours["generationConfig"]["customHeaders"] == {"X-User-Id": "alice"}
        assert cfg["security"]["auth"]["selectedType"] == "openai" and cfg["model"]["name"] == "clawray-policy"
        assert cfg["env"][ours["envKey"]] == target.api_key
    else:
        raise AssertionError(f"no check for {agent}")


def test_every_agent_has_an_existing_config_case():
    assert set(EXISTING) == set(AGENTS)
    assert {"openclaw", "claude-code", "codex", "copaw", "hermes"} <= set(AGENTS)


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_setup_from_nothing_then_restore_removes_everything(tmp_path: Path, name: str):
    home = tmp_path / "home"
    home.mkdir()
    apply.setup(get(name), home, {}, T)
    _check_points_at_clawray(name, _written(home, name))
    for f in get(name).files(home, {}, T):
        if f.secret:  # may hold a key: readable by its owner only
            assert f.path.stat().st_mode & 0o077 == 0
    apply.restore(get(name), home)
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == [Path(".clawray")]


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_setup_keeps_unrelated_and_sandbox_keys_and_restore_is_byte_exact(tmp_path: Path, name: str):
    rel, text, kept = EXISTING[name]
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode())
    os.chmod(path, 0o640)
    before = _load(path)
    agent = get(name)
    apply.setup(agent, tmp_path, {}, T)
    after = _load(path)
    for p in kept:
        assert _get(after, p) == _get(before, p), p
    _check_points_at_clawray(name, _written(tmp_path, name))
    assert path.stat().st_mode & 0o777 == 0o640  # an existing file keeps its mode
    apply.setup(agent, tmp_path, {}, T)  # idempotent: the second setup keeps the first backup
    apply.restore(agent, tmp_path)
    assert path.read_bytes() == text.encode() and path.stat().st_mode & 0o777 == 0o640
    assert not (tmp_path / ".clawray" / "agent-backups").exists()


def test_codex_edit_keeps_comments_and_layout(tmp_path: Path):
    rel, text, _ = EXISTING["codex"]
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    path.write_text(text)
    apply.setup(get("codex"), tmp_path, {}, T)
    out = path.read_text()
    for line in ("# my codex settings", "network_access = false  # keep this", 'args = ["--port", "3000"]',
                 'approval_policy = "on-request"'):
        assert line in out
    assert out.index('model_provider = "clawray"') < out.index("[sandbox_workspace_write]")  # root keys first


@pytest.mark.parametrize("name, text", [
    ("claude-code", '{"env": {}, // a comment\n}'),
    ("codex", 'model = "gpt-5"\n[model_providers.x\n'),
    ("codex", 'model_providers = { clawray = { name = "x" } }\n'),  # valid TOML, but not editable in place
    ("openclaw", "{ models: { mode: 'merge' }, }  // JSON5\n"),
    ("hermes", "- just\n- a list\n"),
    ("hermes", "model: [unclosed\n"),
    ("copaw", "not json"),
    ("qwen-code", "[1, 2]"),
])
def test_unknown_format_is_refused_and_untouched(tmp_path: Path, name: str, text: str):
    agent = get(name)
    path = agent.files(tmp_path, {}, T)[-1 if name == "copaw" else 0].path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    runner = CliRunner()
    r = runner.invoke(agents_app, ["setup", name], env={"HOME": str(tmp_path), "CLAWRAY_API_KEY": None})
    assert r.exit_code == 1 and "unknown format" in r.output and "left it untouched" in r.output
    assert path.read_text() == text
    assert not (tmp_path / ".clawray").exists()  # no backup: nothing was set up
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no other file written beside it


def test_proxy_key_goes_to_the_agents_secret_files_not_the_config(tmp_path: Path):
    for name in AGENTS:
        apply.setup(get(name), tmp_path, {}, TK)
        _check_points_at_clawray(name, _written(tmp_path, name, TK), TK)
    for folder in (".codex", ".openclaw", ".hermes"):
        assert formats.load("env", (tmp_path / folder / ".env").read_text()) == {"CLAWRAY_API_KEY": "sekrit"}
        assert ((tmp_path / folder / ".env").stat().st_mode & 0o077) == 0
    assert "sekrit" not in (tmp_path / ".codex" / "config.toml").read_text()
    assert _load(tmp_path / ".openclaw" / "openclaw.json")["models"]["providers"]["clawray"]["apiKey"] == {
        "source": "env", "provider": "default", "id": "CLAWRAY_API_KEY"}
    assert _load(tmp_path / ".hermes" / "config.yaml")["providers"]["clawray"] == {
        "name": "clawray", "base_url": URL, "api_mode": "chat_completions", "key_env": "CLAWRAY_API_KEY",
        "default_model": "clawray-policy", "extra_headers": {"X-User-Id": "alice"}, "context_length": 32768}


def test_existing_env_file_keeps_its_other_lines(tmp_path: Path):
    env = tmp_path / ".hermes" / ".env"
    env.parent.mkdir()
    original = "# keys\nOPENROUTER_API_KEY=sk-or-1\nexport OTHER='x y'\n"
    env.write_text(original)
    apply.setup(get("hermes"), tmp_path, {}, TK)
    assert env.read_text() == original + "CLAWRAY_API_KEY=sekrit\n"
    apply.restore(get("hermes"), tmp_path)
    assert env.read_text() == original


def test_env_overrides_move_the_config(tmp_path: Path):
    env = {"CODEX_HOME": str(tmp_path / "cx"), "CLAUDE_CONFIG_DIR": str(tmp_path / "cl"),
           "HERMES_HOME": str(tmp_path / "hm"), "OPENCLAW_CONFIG_PATH": str(tmp_path / "oc.json"),
           "COPAW_SECRET_DIR": str(tmp_path / "cp"), "QWEN_HOME": str(tmp_path / "qw")}
    home = tmp_path / "home"
    for name in AGENTS:
        paths = get(name).config_paths(home, env, T)
        assert all(home not in p.parents for p in paths), (name, paths)


def test_setup_writes_through_a_symlink_and_restore_keeps_it(tmp_path: Path):
    real = tmp_path / "dotfiles" / "settings.json"
    real.parent.mkdir()
    real.write_text('{"theme": "light"}\n')
    link = tmp_path / ".claude" / "settings.json"
    link.parent.mkdir()
    link.symlink_to(real)
    apply.setup(get("claude-code"), tmp_path, {}, T)
    assert link.is_symlink() and _load(real)["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"
    apply.restore(get("claude-code"), tmp_path)
    assert link.is_symlink() and real.read_text() == '{"theme": "light"}\n'


def test_restore_without_setup_and_unknown_agent_fail_clearly(tmp_path: Path):
    runner = CliRunner()
    r = runner.invoke(agents_app, ["restore", "codex"], env={"HOME": str(tmp_path)})
    assert r.exit_code == 1 and "not active for codex" in r.output
    r = runner.invoke(agents_app, ["setup", "nope"], env={"HOME": str(tmp_path)})
    assert r.exit_code == 1 and "unknown agent 'nope'" in r.output


def test_cli_setup_list_restore(tmp_path: Path, monkeypatch):
    import agents.cli

    monkeypatch.setattr(agents.cli, "out", Console(width=300, soft_wrap=True))  # one table row per line
    cfg = tmp_path / "c.yaml"
    cfg.write_text("proxy: {host: 0.0.0.0, port: 9100}\nmodel: {max_model_len: 4096}\n")
    runner = CliRunner()
    env = {"HOME": str(tmp_path), "CLAWRAY_API_KEY": None}
    r = runner.invoke(agents_app, ["-c", str(cfg), "setup", "codex", "--user", "bob", "--workspace", "w1"],
                      env=env)
    assert r.exit_code == 0, r.output
    doc = _load(tmp_path / ".codex" / "config.toml")
    assert doc["model_providers"]["clawray"]["base_url"] == "http://127.0.0.1:9100/v1"  # wildcard bind
    assert doc["model_providers"]["clawray"]["http_headers"] == {"X-User-Id": "bob", "X-Workspace-Id": "w1"}
    r = runner.invoke(agents_app, ["-c", str(cfg), "list"], env=env)
    rows = {cells[1].strip(): cells[-2].strip() for cells in
            (line.split("│") for line in r.output.splitlines()) if len(cells) > 4}
    assert r.exit_code == 0 and rows["codex"] == "on" and rows["hermes"] == "off"
    (tmp_path / ".codex" / "config.toml").write_text('model = "edited"\n')
    r = runner.invoke(agents_app, ["-c", str(cfg), "list"], env=env)
    assert "on, changed since setup" in r.output
    r = runner.invoke(agents_app, ["restore", "codex"], env=env)
    assert r.exit_code == 0 and "dropping changes made since setup" in r.output
    assert not (tmp_path / ".codex").exists()


def test_target_from_config():
    cfg = config_from_dict({"proxy": {"host": "::", "port": 9000}, "model": {"policy_alias": "pol",
                                                                           "max_model_len": 1024}})
    t = target_from_config(cfg, user="u", env={"CLAWRAY_API_KEY": "k"})
    assert t.openai_base_url == "http://127.0.0.1:9000/v1" and t.model == "pol" and t.context_window == 1024
    assert (t.api_key, t.key_env, t.headers) == ("k", "CLAWRAY_API_KEY", {"X-User-Id": "u"})
    t = target_from_config(cfg, env={}, model="m")
    assert (t.api_key, t.key_env, t.headers, t.model) == (PLACEHOLDER_KEY, None, {}, "m")
    assert client_host("::1") == "[::1]" and client_host("gpu-box") == "gpu-box"


@pytest.mark.parametrize("text, new, expected", [
    ("", {"a": "1"}, "a=1\n"),
    ("# c\nexport A=1\nB='x y'\n\nA=2\n", {"A": "3", "B": "x y"}, "# c\nB='x y'\n\nA=3\n"),
    ("A=1\n", {"A": "1", "C": "s p"}, 'A=1\nC="s p"\n'),
])
def test_env_format(text: str, new: dict, expected: str):
    assert formats.render("env", text, formats.load("env", text), new) == expected
    assert formats.load("env", expected) == new


def test_toml_edit_replaces_our_table_and_refuses_what_it_cannot_edit():
    text = '[model_providers.clawray]\nname = "old"\nstale = 1\n\n[model_providers.clawray.sub]\nx = 1\n'
    old = formats.load("toml", text)
    new = {"model": "m", "model_providers": {"clawray": {"name": "new", "http_headers": {"a b": "c"}}}}
    out = formats.render("toml", text, old, new)
    assert tomllib.loads(out) == new and "stale" not in out
    with pytest.raises(formats.FormatError):  # removing a key the edit did not mean to touch
        formats.render("toml", 'a = 1\nb = 2\n', {"a": 1, "b": 2}, {"a": 1})
    dotted = 'model_providers.clawray.name = "old"\n'
    with pytest.raises(formats.FormatError, match="cannot be edited safely"):
        formats.render("toml", dotted, formats.load("toml", dotted), new)
