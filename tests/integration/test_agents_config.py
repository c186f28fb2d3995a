"""The REAL agent CLIs (`make agents`) read the config `clawray agents setup` writes.

Each agent runs one headless prompt in a temporary HOME, inside a fresh network namespace where the only
thing it can reach is a stub endpoint (tests/integration/agent_stub.py) at the base URL setup wrote. The
stub records the requests: the agent's model turn must go to the right route of the right API, name our
model, carry the proxy key (read from where setup put it, not from the environment) and the clawray
headers where the agent supports them. Then `restore` must give back the original config byte for byte,
although the agent has written its own state beside it. No clawray server and no network are needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents import apply
from agents.base import installed
from agents.registry import AGENTS, get
from agents.target import PLACEHOLDER_KEY, Target

pytestmark = pytest.mark.slow

STUB = Path(__file__).with_name("agent_stub.py")
PORT = 18080  # free by construction: the namespace is new
PROMPT = "Reply with the word ok."
RUN_TIMEOUT_S = 240

# The agent's headless command (after the binary), and the route its model turn must reach.
RUNS = {
    "claude-code": (["-p", PROMPT], "/v1/messages"),
    # --strict-config: Codex stops at start-up on any key it does not know, so every key setup wrote is real.
    "codex": (["exec", "--skip-git-repo-check", "--strict-config", PROMPT], "/v1/responses"),
    "openclaw": (["infer", "model", "run", "--local", "--prompt", PROMPT], "/v1/chat/completions"),
    "hermes": (["chat", "-Q", "-q", PROMPT], "/v1/chat/completions"),
    "copaw": (["task", "-i", PROMPT, "--max-iters", "1", "-t", "120"], "/v1/chat/completions"),
    "qwen-code": (["-p", PROMPT], "/v1/chat/completions"),
}
# The config each agent had before setup, with an approval / sandbox setting of its own.
ORIGINAL = {
    "claude-code": (".claude/settings.json", '{\n  "permissions": {"defaultMode": "default"},\n  "theme": "dark"\n}\n'),
    "codex": (".codex/config.toml", '# mine\napproval_policy = "never"\nsandbox_mode = "read-only"\n'),
    "openclaw": (".openclaw/openclaw.json", '{"tools": {"elevated": {"enabled": false}}}'),
    "hermes": (".hermes/config.yaml", "# mine\nterminal:\n  backend: local\n"),
    "copaw": (".copaw.secret/providers/active_model.json", '{"provider_id": "openai", "model": "gpt-5"}'),
    "qwen-code": (".qwen/settings.json", '{"tools": {"approvalMode": "default"}}\n'),
}


def _netns_ok() -> bool:
    try:
        return subprocess.run(["unshare", "-rnpf", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _run_agent(binary: str, args: list[str], home: Path, log: Path) -> str:
    """The agent's output; its requests are in `log`. A new network and PID namespace: nothing but the
    stub is reachable, and every process the agent started dies with it."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home), "TERM": "dumb",
           "NO_COLOR": "1", "LANG": "C.UTF-8"}
    script = 'ip link set lo up && exec "$@"'
    cmd = ["unshare", "-rnpf", "sh", "-c", script, "sh", sys.executable, str(STUB), str(PORT), str(log),
           str(RUN_TIMEOUT_S), "--", binary, *args]
    p = subprocess.run(cmd, env=env, cwd=home, capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 60)
    return (p.stdout + p.stderr)[-3000:]


# Every agent with a proxy key (read from where setup put it); without one only where the config differs
# (the other agents write the placeholder key the same way they write a real one).
CASES = [(name, True) for name in sorted(AGENTS)] + [(name, False) for name in ("codex", "hermes", "openclaw")]


@pytest.mark.skipif(not _netns_ok(), reason="needs `unshare -rnpf` (a private network namespace)")
@pytest.mark.parametrize("name, with_key", CASES, ids=[f"{n}-{'key' if k else 'no-key'}" for n, k in CASES])
def test_real_agent_reads_the_written_config(tmp_path: Path, name: str, with_key: bool):
    agent = get(name)
    binary = installed(agent)
    if binary is None:
        pytest.skip(f"{agent.binary} is not installed: run `make agents`")
    key = "sk-clawray-test-42" if with_key else PLACEHOLDER_KEY
    target = Target(origin=f"http://127.0.0.1:{PORT}", api_key=key, key_env="CLAWRAY_API_KEY" if with_key else None,
                    model="clawray-policy", context_window=32768, headers={"X-User-Id": "alice"})
    home = tmp_path / "home"
    rel, original = ORIGINAL[name]
    (home / rel).parent.mkdir(parents=True)
    (home / rel).write_text(original)
    apply.setup(agent, home, {}, target)

    args, route = RUNS[name]
    log = tmp_path / "requests.jsonl"
    output = _run_agent(binary, args, home, log)
    requests = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    turns = [r for r in requests if r["method"] == "POST" and r["path"].split("?")[0] == route]
    assert turns, f"{name} sent no POST {route}; requests: {[r['path'] for r in requests]}\n{output}"
    turn = turns[0]
    assert turn["model"] == "clawray-policy", turn
    # Without a proxy key Codex sends no Authorization header at all (no `env_key`): the Proxy needs none.
    expected_auth = {f"Bearer {key}"} if with_key else {f"Bearer {key}", None}
    assert turn["headers"].get("authorization") in expected_auth, turn["headers"]
    if agent.headers:
        assert turn["headers"].get("x-user-id") == "alice", turn["headers"]

    apply.restore(agent, home)
    assert (home / rel).read_text() == original


@pytest.mark.skipif(not _netns_ok(), reason="needs `unshare -rnpf` (a private network namespace)")
def test_openclaw_validates_the_written_config(tmp_path: Path):
    agent = get("openclaw")
    binary = installed(agent)
    if binary is None:
        pytest.skip("openclaw is not installed: run `make agents`")
    target = Target(origin="http://127.0.0.1:18080", api_key="k", key_env="CLAWRAY_API_KEY",
                    model="clawray-policy", context_window=32768, headers={"X-User-Id": "alice"})
    apply.setup(agent, tmp_path, {}, target)
    output = _run_agent(binary, ["config", "validate"], tmp_path, tmp_path / "requests.jsonl")
    assert "Config valid" in output, output
