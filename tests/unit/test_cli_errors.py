"""The CLI's promise for a failure: its message as is, one clear error, no traceback (cluster/cli.py `main`).

Seen failing before: an error whose text held something like a rich markup tag (HAProxy's
"[/tmp/cr-ha-.../haproxy.cfg:45]" when Serve could not start it) crashed the error printer itself with
rich's MarkupError, so `clawray bench` ended in a traceback that hid the real error."""

from __future__ import annotations

import pytest

from cluster import cli
from core.config import ConfigError

BRACKETED = "HAProxy crashed: [ALERT] [/tmp/cr-ha-x/haproxy.cfg:45] cannot bind [127.0.0.1:44747] [bold]"


@pytest.mark.parametrize("error, code", [
    (RuntimeError(BRACKETED), 1),
    (cli.CLIError(BRACKETED, hint="free the port [/etc/x]"), 2),
    (ConfigError(BRACKETED), 2),
], ids=["unexpected", "cli-error", "config-error"])
def test_an_error_is_printed_as_written_whatever_brackets_it_holds(monkeypatch, capsys, error, code):
    def failing(standalone_mode: bool):
        raise error

    monkeypatch.setattr(cli, "app", failing)
    monkeypatch.delenv("CLAWRAY_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == code
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert BRACKETED in out
    if isinstance(error, cli.CLIError):
        assert "free the port [/etc/x]" in out
