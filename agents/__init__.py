"""Agent integrations: point OpenClaw, Claude Code, Codex, CoPaw, Hermes… at clawray and restore them.

One module per agent knows its config files and formats (agents/registry.py lists them); agents/apply.py
writes them with a byte-exact backup; agents/cli.py is `clawray agents list | setup NAME | restore NAME`.
scripts/install_agents.sh installs the real agent CLIs (pinned in agents/versions.json) for the tests.
"""
