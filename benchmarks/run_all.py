"""`make bench`: run every benchmark, each in its own process, and write benchmarks/RESULTS.md from their
JSON outputs (benchmarks/out/). RESULTS.md is generated, never edited by hand.

    python -m benchmarks.run_all [--quick] [--only trainer,retrieval] [--timeout 900]

A benchmark whose module is absent is reported as missing; one that fails, times out or leaves no fresh
output is reported as such (with its log under benchmarks/out/logs/), and the others still run. `--quick`
runs each in its small mode (a smoke run: the numbers are noisier). The machine the numbers came from
(CPU model, cores, memory, Python and library versions, load) heads the file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import machine_info, render

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
RESULTS = REPO / "benchmarks" / "RESULTS.md"


@dataclass(frozen=True)
class Bench:
    name: str  # the stem of its outputs in benchmarks/out/ (<name>.json, optional <name>.md)
    module: str = ""  # benchmarks/<module>.py; default: the name
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)
    quick_fallback: tuple[str, ...] | None = None  # when the module has no --quick (yet)
    port: bool = False  # serves HTTP: give it a free port (`--port`), so runs never clash on a fixed one
    timeout_s: float = 0.0  # its own limit when longer than `--timeout`

    @property
    def path(self) -> Path:
        return REPO / "benchmarks" / f"{self.module or self.name}.py"

    def args(self, quick: bool) -> list[str]:
        port = ["--port", str(free_port())] if self.port else []
        if not quick:
            return [*self.full, *port]
        if self.quick_fallback is not None and '"--quick"' not in self.path.read_text(encoding="utf-8"):
            return [*self.quick_fallback, *port]
        return [*self.quick, *port]

    def output_files(self) -> list[Path]:
        return [OUT / f"{self.name}.json", OUT / f"{self.name}.md"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BENCHES = [
    Bench("proxy_overhead", quick_fallback=("--duration", "1", "--no-real"), port=True),
    Bench("proxy_overhead-haproxy", module="proxy_overhead", full=("--ha-proxy",), quick=("--ha-proxy", "--quick"),
          quick_fallback=("--ha-proxy", "--duration", "1", "--no-real"), port=True),
    Bench("whole_path", full=("--tiny",)),  # upstream mode vs a pass-through floor and LiteLLM (its own venv)
    Bench("hotswap"),
    Bench("retrieval"),
    Bench("trainer", quick=("--quick", "--repeats", "1", "--steps", "6")),
    Bench("trainer_floor", quick=("--quick", "--steps", "1")),
    Bench("window_efficiency", quick=("--samples", "16", "--steps", "1")),
    Bench("scale_model", full=("--check",), quick=()),
    # Does the loop help (issue 18): `clawray bench` on the project's workload with the instruction-following
    # model, every condition on fresh systems, 10 seeds (~55 minutes; `make instruct-model` first).
    Bench("efficacy", quick=("--quick",), timeout_s=7200.0),
]


def run_one(b: Bench, quick: bool, timeout_s: float) -> dict[str, Any]:
    """Run benchmark `b` in a subprocess; its status, wall time, log path and fresh outputs."""
    if not b.path.is_file():
        return {"name": b.name, "status": "missing", "detail": f"{b.path.relative_to(REPO)} does not exist"}
    log = OUT / "logs" / f"{b.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", f"benchmarks.{b.path.stem}", *b.args(quick)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.time()
    print(f"[bench] {b.name}: {' '.join(cmd[2:])}", flush=True)
    with open(log, "w", encoding="utf-8") as f:
        # Its own session: on a timeout the whole process group (Ray workers, engine cores) is killed.
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=max(timeout_s, b.timeout_s))
        except subprocess.TimeoutExpired:
            _stop(proc)
            code = None
        except BaseException:  # Ctrl-C: never leave a benchmark (and the Ray cluster it started) running
            _stop(proc)
            raise
    wall = time.time() - t0
    fresh = [p for p in b.output_files() if p.is_file() and p.stat().st_mtime >= t0]
    json_out = any(p.suffix == ".json" for p in fresh)
    status = "timeout" if code is None else "failed" if code != 0 else "ok" if json_out else "no output"
    detail = "" if status == "ok" else _tail(log)
    print(f"[bench] {b.name}: {status} in {wall:.0f}s", flush=True)
    return {"name": b.name, "status": status, "wall_s": wall, "args": cmd[3:], "detail": detail,
            "log": str(log.relative_to(REPO)), "outputs": {p.name: _load(p) for p in fresh}}


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Ctrl-C to the benchmark's process group (it shuts its Ray cluster down), then SIGKILL."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


CARRIED = "*Not re-run by this invocation"
EARLIER = "*(earlier run"  # ends a headline line carried from an earlier run


def carried_over(previous: str, rerun: set[str]) -> str:
    """The sections of benchmarks that `previous` (an earlier RESULTS.md) holds and this run did not redo,
    each marked with the run it came from, so `--only` refreshes some sections without dropping others."""
    known = {b.name for b in BENCHES}
    header = next((line for line in previous.splitlines() if line.startswith("Generated by ")), "")
    header = header.split(" — do not edit")[0][:120]
    # The Machine table above is this run's: a carried section names the CPU that measured it.
    cpu = previous_cpu(previous)
    made = f"{header}, on {cpu}" if cpu else header
    out = []
    for chunk in previous.split("\n## ")[1:]:
        name, _, body = chunk.partition("\n")
        if name in known and name not in rerun:
            lines = body.strip("\n").splitlines()
            notes = [line for line in lines if line.startswith(CARRIED)]
            # Carried over before: the oldest note names the run that measured it (older files stacked one
            # note per later run); otherwise the previous file's own run did.
            note = notes[-1] if notes else f"{CARRIED}; from the previous file ({made})*"
            out += ["", f"## {name}", "", note, "\n".join(line for line in lines if not line.startswith(CARRIED))]
    return "\n".join(out) + ("\n" if out else "")


def previous_cpu(previous: str) -> str:
    """The CPU in the Machine table of `previous` (an earlier RESULTS.md); "" if it has none."""
    return next((line.split("|")[2].strip() for line in previous.splitlines() if line.startswith("| cpu |")), "")


def earlier_headlines(previous: str, rerun: set[str]) -> list[str]:
    """The headline lines of `previous` (an earlier RESULTS.md) whose benchmark this run did not redo. Each
    line names its benchmark in a trailing comment (report.HEADLINE_TAG); lines written before the tags
    existed name none and are kept as they are. A line carried for the first time is marked as earlier, with
    the CPU that measured it (the Machine table will be this run's); a marked line keeps its mark."""
    block = previous.split("## Headline ratios", 1)[1].split("\n## ", 1)[0] if "## Headline ratios" in previous else ""
    cpu = previous_cpu(previous)
    out = []
    for line in block.splitlines():
        if not line.startswith("- ") or "(no benchmark produced results)" in line:
            continue
        tag = re.search(r"<!-- (\S+) -->", line)
        if tag is None or tag.group(1) not in rerun:
            out.append(line if EARLIER in line else f"{line} {EARLIER}, on {cpu})*" if cpu else f"{line} {EARLIER})*")
    return out


def _tail(log: Path, n: int = 3) -> str:
    lines = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    return " / ".join(lines[-n:])[-400:]


def _load(p: Path) -> Any:
    text = p.read_text(encoding="utf-8")
    return json.loads(text) if p.suffix == ".json" else text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="each benchmark's small mode (smoke run)")
    ap.add_argument("--only", default="", help="comma-separated benchmark names")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where to write the report")
    a = ap.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    unknown = set(names) - {b.name for b in BENCHES}
    if unknown:
        ap.error(f"unknown benchmark(s) {sorted(unknown)}; valid: {[b.name for b in BENCHES]}")
    machine = machine_info()
    t0 = time.time()
    runs = [run_one(b, a.quick, a.timeout) for b in BENCHES if not names or b.name in names]
    machine["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    machine["total_wall_s"] = round(time.time() - t0)
    previous = a.out.read_text(encoding="utf-8") if names and a.out.is_file() else None
    rerun = {r["name"] for r in runs}
    text = render(runs, machine, quick=a.quick, command=" ".join(["python -m benchmarks.run_all", *(argv or sys.argv[1:])]),
                  earlier_headlines=earlier_headlines(previous, rerun) if previous else None)
    if previous:  # a partial run: what it did not re-run is kept, marked as older
        text += carried_over(previous, rerun)
    a.out.write_text(text)
    print(f"[bench] wrote {a.out.relative_to(REPO) if a.out.is_relative_to(REPO) else a.out}")
    return 0 if all(r["status"] in ("ok", "missing") for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
