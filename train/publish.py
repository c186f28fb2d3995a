"""Publishing a trained LoRA version (`adapters/policy-vNNNN/`) and telling serving to hot-swap it.

A version folder appears atomically: peft's `save_pretrained` and `manifest.json` are written into a
hidden temp folder beside it, fsynced, then renamed into place (and the adapters folder fsynced), so
the serving plane never sees a half-written adapter and a published version survives a power loss.
Temp folders that a crashed publish left behind are removed by the next publish once they are stale
(core/storage.py `TMP_GRACE_S`); old versions are removed by the serving side, which knows what it
serves (serve/engine.py). Every version gets a new name (DESIGN.md "Adapter": vLLM and Ray Serve LLM
cache adapters by name).

On object storage (`storage_root: s3://...`) nothing can be renamed: the adapter is saved to a local temp
folder, uploaded under a unique key and published by a create-only version record
(core/adapter_store.py `RemoteAdapters.publish`); serving is told the URI of the uploaded files.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from core import names
from core.adapter_store import LocalAdapters, RemoteAdapters
from core.config import LoRAConfig
from core.contracts import AdapterManifest, adapter_name, parse_adapter_name
from core.storage import TMP_PREFIX, atomic_write_json, remove_stale_temps, rename_durably

log = logging.getLogger(__name__)


def latest_version(adapters_dir: Path) -> int:
    """Highest published version under `adapters_dir` (0 when none)."""
    best = 0
    if adapters_dir.is_dir():
        for p in adapters_dir.iterdir():
            try:
                best = max(best, parse_adapter_name(p.name))
            except ValueError:
                continue  # temp folders and foreign files are not versions
    return best


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def publish_adapter(
    peft_model,
    adapters: Path | LocalAdapters | RemoteAdapters,
    *,
    base_model: str,
    lora: LoRAConfig,
    step: int,
    skill_generation: int,
    metrics: dict[str, float],
) -> tuple[str, Path | str]:
    """Save `peft_model`'s adapter as the next version of `adapters` (a folder, or core/adapter_store.py
    `adapter_store(layout)`). Returns (name, its folder, or the URI of its files on object storage).

    Single writer (rank 0 of the one training run); if a version of the chosen number appears anyway
    (a folder renamed there first, a record created first), the next number is tried, so a version is
    never overwritten.
    """

    def manifest(version: int, name: str) -> dict:
        return AdapterManifest(
            name=name, version=version, base_model=base_model, rank=lora.rank, alpha=lora.alpha,
            target_modules=list(lora.target_modules), step=step, skill_generation=skill_generation,
            metrics={k: float(v) for k, v in metrics.items()},
        ).model_dump(mode="json")

    if isinstance(adapters, RemoteAdapters):
        with tempfile.TemporaryDirectory(prefix="clawray-adapter-") as tmp:
            peft_model.save_pretrained(tmp)
            return adapters.publish(Path(tmp), manifest)
    return _publish_local(peft_model, adapters.dir if isinstance(adapters, LocalAdapters) else adapters, manifest)


def _publish_local(peft_model, adapters_dir: Path, manifest) -> tuple[str, Path]:
    adapters_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(adapters_dir)  # what a publish that crashed before its rename left behind
    tmp = adapters_dir / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    try:
        peft_model.save_pretrained(str(tmp))
        for _ in range(100):
            version = latest_version(adapters_dir) + 1
            name = adapter_name(version)
            atomic_write_json(tmp / "manifest.json", manifest(version, name))
            _fsync_tree(tmp)
            final = adapters_dir / name
            try:
                rename_durably(tmp, final)  # atomic; refuses an existing non-empty folder
            except OSError:
                if final.exists():
                    continue
                raise
            return name, final
        raise RuntimeError(f"could not find a free adapter version under {adapters_dir}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def notify_serving(name: str, path: Path | str, timeout_s: float = 120.0) -> bool:
    """Ask the engine deployment (`PolicyEngine`) of the Serve app (`clawray`; core/names.py) to load and activate `name` (`path`:
    what `publish_adapter` returned; the engine checks it against its own storage root).

    Returns False (with a log line) when no Serve app is running: offline training just publishes.
    Errors from a running engine are logged and reported as False; the published adapter stays on disk
    and serving can load it later, so a serving hiccup never fails a training step.
    """
    import ray
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        handle = serve.get_deployment_handle(names.ENGINE, app_name=names.APP)
    except (RayServeException, KeyError) as e:
        log.info("no Serve app %r/%s (%s): published %s without hot-swap", names.APP, names.ENGINE, e, name)
        return False
    try:
        handle.load_adapter.remote(name, str(path)).result(timeout_s=timeout_s)
        handle.activate.remote(name).result(timeout_s=timeout_s)
    except (ray.exceptions.RayError, RayServeException, TimeoutError) as e:
        log.error("serving did not take adapter %s: %s", name, e)
        return False
    log.info("serving activated adapter %s", name)
    return True
