import json
import sqlite3

from cluster.report import load_windows, rolling_mean, write_report
from core.storage import StorageLayout, atomic_write_json


def test_rolling_mean_window():
    assert rolling_mean([1, 3, 5, 7], window=2) == [1, 2, 4, 6]


def test_report_png_from_storage(tmp_path):
    layout = StorageLayout(tmp_path).ensure()
    db = sqlite3.connect(layout.replay / "replay.sqlite")
    db.execute("CREATE TABLE samples (created_at REAL, state TEXT, generation INT, payload TEXT)")
    for i in range(10):
        db.execute("INSERT INTO samples VALUES (?,?,?,?)",
                   (100.0 + i, "fresh" if i % 2 else "retired", i // 5,
                    json.dumps({"reward": (i % 3) - 1, "adapter_version": None})))
    db.commit()
    (layout.skills / "history.jsonl").write_text(json.dumps({"ts": "1970-01-01T00:01:45Z", "generation": 1}) + "\n")
    atomic_write_json(layout.control / "controller.json", {"history": [
        {"event": "run_started", "at": 104.0, "run": 1},
        {"event": "run_finished", "at": 107.0, "run": 1, "steps": 2}]})
    atomic_write_json(layout.adapters / "policy-v0001" / "manifest.json", {"name": "policy-v0001", "created_at": 106.0})
    assert [(s, e) for s, e, _ in load_windows(layout)] == [(104.0, 107.0)]
    out = write_report(tmp_path, tmp_path / "r.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
