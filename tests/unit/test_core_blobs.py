"""Blobs on object storage (issue 13): `core/blobs.py` (`BlobStore`) and the adapter protocol on it
(`core/adapter_store.py`), each run on a local folder and on a real S3 HTTP server (moto_server, which
answers a create-only PUT on an existing key with 412), plus the config rules for a remote storage root.

Concurrency is driven by barriers (never sleeps): every racer has read the same state before any writes.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from core.config import REPO_ROOT, ConfigError, config_from_dict
from tests.servers import make_bucket


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


# ------------------------------------------------------------------------------------------- BlobStore
def test_a_tree_put_under_a_key_comes_back_whole_into_a_local_folder(blob_root: str, tmp_path: Path):
    from core.blobs import BlobStore

    store = BlobStore(blob_root)
    src = _tree(tmp_path / "src", {"adapter_config.json": b"{}", "w/model.bin": b"\x00" * 1000})
    store.put_tree(src, "adapters/x-1")
    store.put_file(src / "adapter_config.json", "adapters/loose.json")
    assert sorted(store.list("adapters")) == ["loose.json", "x-1"]
    assert sorted(store.find("adapters/x-1")) == ["adapter_config.json", "w/model.bin"]
    out = store.get_tree("adapters/x-1", tmp_path / "cache" / "x-1")
    assert (out / "w" / "model.bin").read_bytes() == b"\x00" * 1000
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["x-1"]  # no temp folder left behind
    store.delete("adapters/x-1")
    store.delete("adapters/x-1")  # idempotent
    assert store.list("adapters") == ["loose.json"] and store.read("adapters/x-1/adapter_config.json") is None


def test_a_create_only_write_has_exactly_one_winner_among_concurrent_writers(blob_root: str):
    from core.blobs import BlobStore

    n = 6
    barrier, wins = threading.Barrier(n), [None] * n

    def race(i: int) -> None:
        store = BlobStore(blob_root)  # one client per writer, like separate hosts
        barrier.wait()
        wins[i] = store.write_new("ptr/000001.json", f"writer {i}".encode())

    threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins.count(True) == 1, wins
    assert BlobStore(blob_root).read("ptr/000001.json") == f"writer {wins.index(True)}".encode()


def test_a_create_only_write_of_the_same_bytes_again_counts_as_won(blob_root: str):
    """A retried PUT whose first attempt landed (response lost) finds its own bytes: still the winner."""
    from core.blobs import BlobStore

    store = BlobStore(blob_root)
    assert store.write_new("k.json", b"mine") and store.write_new("k.json", b"mine")
    assert not store.write_new("k.json", b"theirs")


# ------------------------------------------------------------------------------------- adapter protocol
def _adapter(tmp_path: Path, tag: str) -> Path:
    return _tree(tmp_path / f"peft-{tag}", {"adapter_config.json": json.dumps({"tag": tag}).encode(),
                                            "adapter_model.safetensors": tag.encode() * 100})


def _manifest(version: int, name: str) -> dict:
    return {"name": name, "version": version}


def test_two_concurrent_publishers_never_win_the_same_version(blob_root: str, tmp_path: Path):
    from core.adapter_store import RemoteAdapters

    barrier, results = threading.Barrier(2), {}

    def publisher(tag: str) -> None:
        store = RemoteAdapters(blob_root, tmp_path / f"cache-{tag}")
        first = store.latest_version

        def latest_after_both_read() -> int:  # both see the same newest version before either publishes
            v = first()
            if tag not in results:
                results[tag] = None
                barrier.wait()
            return v

        store.latest_version = latest_after_both_read
        results[tag] = store.publish(_adapter(tmp_path, tag), _manifest)

    threads = [threading.Thread(target=publisher, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = sorted(name for name, _ in results.values())
    assert names == ["policy-v0001", "policy-v0002"], results
    reader = RemoteAdapters(blob_root, tmp_path / "cache-reader")
    for tag, (name, location) in results.items():  # each version is its publisher's own bytes
        folder = reader.folder(name, location)
        assert json.loads((folder / "adapter_config.json").read_text()) == {"tag": tag}
        assert json.loads((folder / "manifest.json").read_text())["name"] == name
    # the loser's upload under the version it lost is gone: one tree per published version
    trees = [n for n in reader.blobs.list("adapters") if n.startswith("policy-v") and not n.endswith(".json")]
    assert len(trees) == 2 and sorted(t.rsplit("-", 1)[0] for t in trees) == names


def test_serving_loads_a_version_from_a_local_cache_filled_from_the_store(blob_root: str, tmp_path: Path):
    from core.adapter_store import RemoteAdapters

    trainer = RemoteAdapters(blob_root, tmp_path / "trainer-scratch")
    name, location = trainer.publish(_adapter(tmp_path, "a"), _manifest)
    assert location.startswith(blob_root.rstrip("/") + "/adapters/policy-v0001-")
    serving = RemoteAdapters(blob_root, tmp_path / "serve-cache")
    folder = serving.folder(name, None)
    assert folder.parent == tmp_path / "serve-cache" and (folder / "adapter_config.json").is_file()
    assert serving.folder(name, location) == folder  # second call: the cache, no download
    with pytest.raises(ValueError, match="must be loaded from"):
        serving.folder(name, "/tmp/elsewhere")
    with pytest.raises(LookupError, match="policy-v0009"):
        serving.folder("policy-v0009", None)


def test_concurrent_activations_are_all_kept_in_the_pointer(blob_root: str, tmp_path: Path):
    """Two replicas activate at once: the pointer is switched by create-only writes, so neither switch
    overwrites the other and both versions stay in `recent` (their files are kept on disk)."""
    from core.adapter_store import RemoteAdapters

    barrier, stores = threading.Barrier(2), {}
    for tag in ("a", "b"):
        stores[tag] = RemoteAdapters(blob_root, tmp_path / f"cache-{tag}")
        read = stores[tag].read_active

        def read_then_wait(read=read, tag=tag):
            state = read()
            if not stores.get(f"waited-{tag}"):
                stores[f"waited-{tag}"] = True
                barrier.wait()
            return state

        stores[tag].read_active = read_then_wait
    threads = [threading.Thread(target=stores[t].set_active, args=(f"policy-v000{i}", 3))
               for i, t in enumerate(("a", "b"), start=1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = RemoteAdapters(blob_root, tmp_path / "c").read_active()
    assert sorted(state["recent"]) == ["policy-v0001", "policy-v0002"]
    assert state["active"] == state["recent"][-1]


def test_pruning_removes_old_versions_orphans_and_their_cache_but_never_a_kept_one(blob_root, tmp_path):
    from core.adapter_store import RemoteAdapters

    store = RemoteAdapters(blob_root, tmp_path / "cache")
    names = [store.publish(_adapter(tmp_path, str(i)), _manifest)[0] for i in range(1, 6)]
    for name in names:
        store.folder(name, None)
    orphan = "adapters/policy-v0009-crashed"  # a publisher that died between upload and record
    store.blobs.put_tree(_adapter(tmp_path, "o"), orphan)
    gone = store.prune({names[0]}, keep_newest=2, grace_s=-1.0)
    assert sorted(gone) == [names[1], names[2], "policy-v0009-crashed"]
    assert store.versions() == [names[0], names[3], names[4]]
    cached = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "cache").iterdir())
    assert cached == [names[0], names[3], names[4]]
    assert store.prune({names[0]}, keep_newest=2) == []


# ------------------------------------------------------------------------------------------------ config
def test_a_remote_storage_root_needs_postgresql_state():
    with pytest.raises(ConfigError, match=r"storage_root s3://b/p needs state\.dsn"):
        config_from_dict({"storage_root": "s3://b/p"})


def test_a_remote_storage_root_keeps_local_scratch_under_the_cache_dir():
    cfg = config_from_dict({"storage_root": "s3://bkt/team/prod/", "cache_dir": "/var/cache/clawray",
                            "state": {"dsn": "postgresql://u@db/clawray"}})
    assert cfg.blob_root() == "s3://bkt/team/prod"
    assert cfg.storage_path() == Path("/var/cache/clawray/storage/s3-bkt-team-prod")
    local = config_from_dict({})
    assert local.blob_root() is None and local.storage_path() == REPO_ROOT / "state" / "local"


@pytest.mark.parametrize("root", ["http://host/x", "s3://", "ftp://b/p"])
def test_unsupported_or_bucketless_roots_are_refused(root: str):
    with pytest.raises(ConfigError, match="storage_root"):
        config_from_dict({"storage_root": root, "state": {"dsn": "postgresql://u@db/x"}})


def test_gs_without_gcsfs_names_the_package(monkeypatch):
    import sys

    from core.blobs import BlobStore

    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if not installed
    with pytest.raises(ConfigError, match="pip install gcsfs"):
        BlobStore("gs://bkt/prefix")


def test_ray_train_checkpoints_go_to_the_same_bucket(s3_env: str, tmp_path: Path, monkeypatch):
    """`checkpoint_storage` gives Ray Train a prefix-stripped path on a pyarrow filesystem over the same
    S3 client as the blobs; a file written through it is an object under `<root>/checkpoints/`. Ray
    pickles it into its controller and workers, which may not have the driver's env: the copy must still
    reach the driver's endpoint."""
    import pickle

    import pyarrow.fs

    from core.blobs import BlobStore, checkpoint_storage
    from core.storage import StorageLayout

    root = f"s3://{make_bucket(s3_env)}/p"
    path, built = checkpoint_storage(StorageLayout(tmp_path, blob_root=root))
    assert path == root[len("s3://"):] + "/checkpoints" and isinstance(built, pyarrow.fs.FileSystem)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")  # as in a Ray process started before the driver set it
    fs = pickle.loads(pickle.dumps(built))
    fs.create_dir(f"{path}/run/step_1")
    with fs.open_output_stream(f"{path}/run/step_1/state.json") as f:
        f.write(b'{"step": 1}')
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_env)
    assert BlobStore(root).read("checkpoints/run/step_1/state.json") == b'{"step": 1}'
    assert checkpoint_storage(StorageLayout(tmp_path)) == (str(tmp_path / "checkpoints"), None)
