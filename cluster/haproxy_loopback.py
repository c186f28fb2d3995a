"""Ray Serve's HAProxy, run with its stats page and metrics exporter on loopback only.

Ray 2.60's HAProxy config template hard-codes two listeners on all interfaces, without authentication:
`listen stats` (`bind *:<stats port>`: backends, replica names and ports, request counts) and `frontend
prometheus` (`bind :<metrics port>`); only their ports can be set. Serve lets an operator name the HAProxy
binary (`RAY_SERVE_HAPROXY_BINARY_PATH`) and starts it as `<binary> -db -f <config> [...]`, so clawray
names a small script (`write_wrapper`) that runs this file: it rewrites those two binds in the config to
127.0.0.1, then replaces itself with the real HAProxy (same pid and arguments: Serve signals and counts its
HAProxy processes by pid and by the config path in their command line). In `--strict` mode (the proxy's
host is loopback) it refuses to start HAProxy while any listener would be beyond loopback, naming it.

Why hand-written: neither Ray nor HAProxy has a setting for these bind addresses, and HAProxy has no
"override a bind" option (a second `-f` file adds listeners, it cannot move them).

This file runs as `python -I haproxy_loopback.py ...` in Serve's HAProxy manager process: standard library
only, no clawray imports.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import shlex
import sys
from pathlib import Path

WRAPPER_NAME = "haproxy-loopback"  # the script in clawray's private HAProxy folder (cluster/serve_app.py)
STRICT_FLAG = "--strict"
_BIND = re.compile(r"^(?P<indent>\s*)bind\s+(?P<addr>\S+)(?P<rest>.*)$")
_WILDCARD = ("", "*", "0.0.0.0", "::", "[::]")


def split_address(addr: str) -> tuple[str | None, str]:
    """(host, port) of an HAProxy bind address `host:port`, `*:port`, `:port`, `[v6]:port`, `ipv4@host:port`;
    (None, addr) for what is no TCP address (a unix socket path, `unix@`, `abns@`, `fd@`...)."""
    family, _, rest = addr.rpartition("@")
    if family not in ("", "ipv4", "ipv6", "tcp", "tcp4", "tcp6") or addr.startswith("/") or ":" not in rest:
        return None, addr
    host, _, port = rest.rpartition(":")
    return host, port


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def rewrite(config: str, ports: set[int]) -> tuple[str, list[str]]:
    """The config with every wildcard `bind` on one of `ports` moved to 127.0.0.1, and the bind lines that
    still listen beyond loopback (TCP listeners whose address is not loopback)."""
    out, beyond = [], []
    for line in config.splitlines(keepends=True):
        m = _BIND.match(line.rstrip("\n"))
        if m is None:
            out.append(line)
            continue
        host, port = split_address(m["addr"])
        if host is not None and host in _WILDCARD and port.isdigit() and int(port) in ports:
            line = f"{m['indent']}bind 127.0.0.1:{port}{m['rest']}" + ("\n" if line.endswith("\n") else "")
        elif host is not None and not is_loopback_host(host):
            beyond.append(line.strip())
        out.append(line)
    return "".join(out), beyond


def config_path(args: list[str]) -> Path:
    """The `-f <file>` HAProxy is started with (Serve passes exactly one)."""
    files = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-f"]
    if len(files) != 1:
        raise SystemExit(f"clawray haproxy-loopback: expected one `-f <config>` in {args!r}")
    return Path(files[0])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="haproxy-loopback")
    ap.add_argument("--real", required=True, help="the HAProxy binary to run")
    ap.add_argument("--ports", required=True, help="comma-separated ports to keep on loopback")
    ap.add_argument(STRICT_FLAG, action="store_true", help="refuse any listener beyond loopback")
    ap.add_argument("haproxy_args", nargs=argparse.REMAINDER, help="-- then HAProxy's own arguments")
    opts = ap.parse_args(argv)
    args = opts.haproxy_args[1:] if opts.haproxy_args[:1] == ["--"] else opts.haproxy_args
    if "-f" in args:  # `haproxy -v` and the like have no config
        path = config_path(args)
        text, beyond = rewrite(path.read_text(), {int(p) for p in opts.ports.split(",") if p})
        if opts.strict and beyond:
            raise SystemExit("clawray: refusing to start HAProxy with a listener beyond loopback while "
                             f"proxy.host is loopback ({path}): {'; '.join(beyond)}")
        tmp = path.with_name(path.name + ".loopback")
        tmp.write_text(text)
        os.replace(tmp, path)  # Serve writes the config and then starts us; nothing reads it in between
    os.execv(opts.real, [opts.real, *args])


def write_wrapper(folder: Path, real: str, ports: list[int], strict: bool, python: str = sys.executable) -> Path:
    """The executable that Serve starts as its HAProxy (`RAY_SERVE_HAPROXY_BINARY_PATH`), in `folder`."""
    cmd = [python, "-I", str(Path(__file__).resolve()), "--real", real, "--ports", ",".join(map(str, ports))]
    cmd += [STRICT_FLAG] if strict else []
    path = folder / WRAPPER_NAME
    path.write_text("#!/bin/sh\n# clawray: Serve's HAProxy with its stats and metrics on loopback "
                    "(cluster/haproxy_loopback.py)\nexec " + " ".join(map(shlex.quote, cmd)) + ' -- "$@"\n')
    path.chmod(0o700)
    return path


def is_strict_wrapper(path: str | None) -> bool:
    """Whether `path` (RAY_SERVE_HAPROXY_BINARY_PATH) is a wrapper `write_wrapper` made in strict mode."""
    if not path or Path(path).name != WRAPPER_NAME:
        return False
    try:
        text = Path(path).read_text()
    except OSError:
        return False
    return "haproxy_loopback.py" in text and f" {STRICT_FLAG} " in text


if __name__ == "__main__":
    main()
