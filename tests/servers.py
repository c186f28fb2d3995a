"""Real servers the tests start themselves (never skipped for want of one): PostgreSQL through `pgserver`
(PostgreSQL 16 binaries from PyPI, a private server under a temp dir) and an S3-compatible HTTP server
(`moto_server`, which enforces conditional writes: If-None-Match / If-Match -> 412)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres(tmpdir: Path) -> Iterator[str]:
    """A private PostgreSQL server for the block; yields its DSN (Unix socket, no password)."""
    import pgserver

    srv = pgserver.get_server(tmpdir / "pgdata", cleanup_mode="stop")
    try:
        yield srv.get_uri()
    finally:
        srv.cleanup()


def unique_namespace(prefix: str = "t") -> str:
    """A fresh schema prefix: every test's stores start empty in the shared server."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@contextmanager
def s3_server() -> Iterator[str]:
    """`moto_server` on a free loopback port; yields its endpoint URL. Credentials are dummies (moto)."""
    port = free_port()
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on port {port}") from None
                time.sleep(0.1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def make_bucket(endpoint: str) -> str:
    """A new, empty bucket on the S3 server at `endpoint`; its name."""
    import boto3

    name = f"clawray-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
