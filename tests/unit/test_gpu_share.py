"""One GPU for the engine and the trainer (issue 14 item 3): the engine sleeps while a run trains.

What runs here is the real code of every layer: the config's resolution of `share_gpu_with_training`, the
Controller's sequencing (cluster/controller.py with cluster/gpu_share.py), the engine's sleep gate and
deferred adapter loads (serve/engine.py `PolicyEngineImpl`), the Proxy's 503 and the engine judge's retry.

Test doubles, and why: vLLM's sleep mode needs CUDA, and this machine has none. The installed vLLM's CPU
platform refuses `--enable-sleep-mode` at start-up (checked below against vLLM itself), so the two
GPU-only calls, `VLLMServing.sleep` / `wake_up`, are a fake that records the order of calls (as the other
engine unit tests fake `add_lora` / `chat`). The Controller's training run is a fake `TrainJob` (same
interface) that the test ends when it chooses and that publishes the way the trainer does
(`load_adapter` + `activate` on the engine); real runs are the integration tests' business, and on a GPU
`scripts/gpu_check.sh` runs the whole cycle for real. OMLS is a fake with the state the test sets.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from cluster import gpu_share
from core.config import ConfigError, EngineConfig, ModelConfig, config_from_dict
from core.contracts import adapter_name
from serve.capture import Capture
from serve.engine import PolicyEngineImpl
from serve.local_handle import LocalHandle
from serve.protocol import EngineRequestError, Reply

ONE_GPU = {"engine": {"device": "gpu", "num_gpus": 0.5}, "train": {"use_gpu": True, "gpus_per_worker": 0.5}}


def one_gpu_config(root: Path, **extra: Any):
    return config_from_dict({"storage_root": str(root), **ONE_GPU, **extra})


# ---- config ----------------------------------------------------------------------------------------


def test_auto_sleeps_when_the_ray_gpu_asks_put_engine_and_trainer_on_one_gpu(tmp_path):
    assert one_gpu_config(tmp_path).engine.share_gpu_with_training == "sleep"
    assert one_gpu_config(tmp_path).train.worker_bundle() == {"CPU": 1.0, "GPU": 0.5}
    whole = config_from_dict({"engine": {"device": "gpu", "num_gpus": 1}, "train": {"use_gpu": True}})
    assert whole.engine.share_gpu_with_training == "off"  # configs/gpu.yaml: a GPU each
    assert config_from_dict({}).engine.share_gpu_with_training == "off"  # CPU: nothing to share
    off = config_from_dict({**ONE_GPU, "engine": {**ONE_GPU["engine"], "share_gpu_with_training": "off"}})
    assert off.engine.share_gpu_with_training == "off"


@pytest.mark.parametrize(("engine", "train", "why"), [
    ({}, {"use_gpu": True}, "needs a GPU"),
    ({"device": "gpu", "num_replicas": 2}, {"use_gpu": True}, "one engine replica"),
    ({"device": "gpu"}, {}, "training does not use a GPU"),
    ({"device": "gpu", "backend": "upstream", "upstream": {"base_url": "http://127.0.0.1:1/v1", "model": "m"}},
     {"use_gpu": True}, "only the vLLM engine"),
])
def test_sleep_where_it_cannot_work_is_a_config_error_naming_the_key(engine, train, why):
    with pytest.raises(ConfigError, match=f"engine.share_gpu_with_training is 'sleep', but .*{why}"):
        config_from_dict({"engine": {**engine, "share_gpu_with_training": "sleep"}, "train": train})


def test_the_engine_starts_with_vllm_sleep_mode_only_when_it_shares_its_gpu():
    from serve.vllm_engine import vllm_cli_args

    def flags(share: str) -> list[str]:
        return vllm_cli_args("/m", ModelConfig(), EngineConfig(device="gpu", share_gpu_with_training=share))

    assert "--enable-sleep-mode" in flags("sleep")
    assert "--enable-sleep-mode" not in flags("off")


def test_vllm_on_this_cpu_platform_refuses_sleep_mode_which_the_config_refuses_first():
    """The honest CPU behaviour: the installed vLLM (CPU build) refuses sleep mode when it builds its
    model config, before any engine starts; our config says so earlier, with the key to change."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from serve.vllm_engine import vllm_cli_args

    if current_platform.is_sleep_mode_available():
        pytest.skip("this vLLM build has sleep mode (a GPU build): the CPU refusal does not apply")
    tiny = Path(__file__).resolve().parents[2] / ".cache" / "tiny-chat"
    if not (tiny / "config.json").is_file():
        pytest.skip("the tiny model is not built (make model)")
    engine = EngineConfig(share_gpu_with_training="sleep", max_lora_rank=8)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        vllm_cli_args(str(tiny), ModelConfig(max_model_len=256), engine))
    assert args.enable_sleep_mode
    with pytest.raises(ValueError, match="Sleep mode is not supported on current platform"):
        AsyncEngineArgs.from_cli_args(args).create_model_config()
    with pytest.raises(ConfigError, match="sleep mode needs a GPU"):
        config_from_dict({"engine": {"share_gpu_with_training": "sleep"}, "train": {"use_gpu": True}})


# ---- the pure policy -------------------------------------------------------------------------------


@pytest.mark.parametrize(("sharing", "slept", "running", "starting", "want"), [
    (True, False, False, True, gpu_share.SLEEP),  # a run is about to start on the shared GPU
    (True, True, False, True, gpu_share.SLEEP),  # again: the engine may have restarted awake since
    (False, False, False, True, None),  # not sharing: runs never touch the engine
    (True, True, True, False, None),  # the run trains: the engine sleeps on
    (True, True, False, False, gpu_share.WAKE),  # the run ended (finished, failed, stopped, lost)
    (False, True, False, False, gpu_share.WAKE),  # put to sleep under an older config: woken all the same
    (True, False, False, False, None),  # awake, nothing to do
])
def test_engine_action(sharing, slept, running, starting, want):
    assert gpu_share.engine_action(sharing, slept, running, starting) == want


# ---- the engine ------------------------------------------------------------------------------------


class FakeVLLM:
    """`VLLMServing`'s calls the engine makes; `sleep` / `wake_up` stand for vLLM's CUDA-only sleep mode.
    `calls` records their order; `chat` can be held in flight."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.asleep = False
        self.hold: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.fail_wake = 0  # wakes that fail before one succeeds

    async def add_lora(self, name: str, path: str) -> None:
        assert not self.asleep, "an adapter was loaded into a sleeping vLLM"
        self.calls.append(("add_lora", name))

    async def remove_lora(self, name: str) -> None:
        assert not self.asleep
        self.calls.append(("remove_lora", name))

    async def chat(self, body: dict) -> Reply:
        assert not self.asleep, "a request reached a sleeping vLLM"
        self.calls.append(("chat", body["model"]))
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        return Reply({"model": body["model"], "choices": []}, Capture(key="k"), [])

    async def sleep(self) -> None:
        self.calls.append(("sleep",))
        self.asleep = True

    async def wake_up(self) -> None:
        if self.fail_wake:
            self.fail_wake -= 1
            raise RuntimeError("CUDA out of memory")
        self.calls.append(("wake_up",))
        self.asleep = False


def make_engine(root: Path, share: str = "sleep", wait_s: float = 5.0) -> tuple[PolicyEngineImpl, FakeVLLM]:
    impl = PolicyEngineImpl("unused", {}, {"share_gpu_with_training": share}, str(root))
    impl.vllm = fake = FakeVLLM()
    impl.gate.wait_s = wait_s
    return impl, fake


def publish(root: Path, version: int) -> str:
    """A version folder as the trainer publishes it (the engine checks it exists; the fake loads it)."""
    name = adapter_name(version)
    folder = root / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    return name


async def trainer_publishes(engine: Any, name: str, root: Path) -> dict:
    """What train/publish.py `notify_serving` asks of the engine after each step."""
    await engine.load_adapter(name, str(root / "adapters" / name))
    return await engine.activate(name)


async def settle() -> None:
    """Let every ready task run until it blocks (deterministic: one event loop, no timers involved)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_sleep_lets_requests_in_flight_finish_and_holds_new_ones_until_the_wake(tmp_path):
    async def scenario() -> None:
        impl, fake = make_engine(tmp_path)
        fake.hold = asyncio.Event()
        first = asyncio.ensure_future(impl.chat({"model": "clawray-policy"}))
        await fake.started.wait()
        sleeping = asyncio.ensure_future(impl.sleep())
        await settle()
        assert fake.calls == [("chat", "clawray-base")]  # vLLM does not sleep under a running request
        second = asyncio.ensure_future(impl.chat({"model": "clawray-policy"}))
        fake.hold.set()
        await first
        assert (await sleeping)["asleep"] and await impl.is_sleeping()
        await settle()
        assert not second.done()  # waits at the gate, never reaches the sleeping vLLM
        await impl.wake_up()
        await second
        assert fake.calls == [("chat", "clawray-base"), ("sleep",), ("wake_up",), ("chat", "clawray-base")]

    asyncio.run(scenario())


def test_a_request_that_waits_too_long_is_refused_with_503_and_retry_after(tmp_path):
    async def scenario() -> None:
        impl, fake = make_engine(tmp_path, wait_s=0.05)
        await impl.sleep()
        with pytest.raises(EngineRequestError) as e:
            await impl.chat({"model": "clawray-policy"})
        assert e.value.status == 503 and e.value.retry_after_s == 30
        assert fake.calls == [("sleep",)]

    asyncio.run(scenario())


def http_request(body: dict[str, Any]):
    """A Starlette request carrying `body` as JSON, as the Proxy's route receives it."""
    from starlette.requests import Request

    data = [json.dumps(body).encode()]

    async def receive():
        return {"type": "http.request", "body": data.pop(0) if data else b"", "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


def test_the_proxy_answers_a_sleeping_engine_with_503_and_a_retry_after_header(tmp_path):
    from serve.proxy import ProxyImpl

    async def scenario() -> None:
        impl, _ = make_engine(tmp_path / "engine", wait_s=0.05)
        await impl.sleep()
        proxy = ProxyImpl(LocalHandle(impl), {}, {"enabled": False}, str(tmp_path / "proxy"))
        proxy._started = True
        try:
            body = {"model": "clawray-policy", "messages": [{"role": "user", "content": "hi"}]}
            response = await proxy.generate(http_request(body), anthropic=False)
        finally:
            proxy.store.close()
        assert response.status_code == 503 and response.headers["retry-after"] == "30"

    asyncio.run(scenario())


def test_an_adapter_published_while_asleep_is_loaded_after_the_wake_and_serves_the_waiting_request(tmp_path):
    async def scenario() -> None:
        impl, fake = make_engine(tmp_path)
        v1 = publish(impl.layout.root, 1)
        await trainer_publishes(impl, v1, impl.layout.root)
        await impl.sleep()
        v2 = publish(impl.layout.root, 2)
        answer = await trainer_publishes(impl, v2, impl.layout.root)  # the run's step, while asleep
        assert answer["deferred"] == v2 and answer["active"] == v1
        assert impl.store.read_active()["active"] == v2  # the pointer: what to serve after the wake
        waiting = asyncio.ensure_future(impl.chat({"model": "clawray-policy"}))
        await settle()
        assert not waiting.done()
        await impl.wake_up()
        assert (await waiting).body["model"] == v2
        assert fake.calls == [("add_lora", v1), ("sleep",), ("wake_up",), ("add_lora", v2), ("chat", v2)]

    asyncio.run(scenario())


def test_a_failed_wake_leaves_the_engine_asleep_and_the_next_wake_serves(tmp_path):
    async def scenario() -> None:
        impl, fake = make_engine(tmp_path)
        await impl.sleep()
        fake.fail_wake = 1
        with pytest.raises(RuntimeError, match="out of memory"):
            await impl.wake_up()
        assert await impl.is_sleeping() and not impl.gate.is_open
        await impl.wake_up()
        assert not await impl.is_sleeping()
        assert (await impl.chat({"model": "clawray-policy"})).body["model"] == "clawray-base"

    asyncio.run(scenario())


def test_an_engine_without_sleep_mode_refuses_to_sleep(tmp_path):
    async def scenario() -> None:
        impl, fake = make_engine(tmp_path, share="off")
        with pytest.raises(EngineRequestError) as e:
            await impl.sleep()
        assert e.value.status == 409 and fake.calls == []
        assert (await impl.wake_up())["asleep"] is False  # waking an awake engine is a no-op

    asyncio.run(scenario())


def test_the_engine_judge_retries_a_turn_later_while_the_engine_sleeps(tmp_path):
    from core.llm import LLMError
    from rewards.engine_judge import EngineJudge

    async def scenario() -> None:
        impl, _ = make_engine(tmp_path, wait_s=0.05)
        await impl.sleep()
        judge = EngineJudge("PolicyEngine", "clawray", "clawray-base", handle=LocalHandle(impl))
        with pytest.raises(LLMError) as e:
            await judge.chat([{"role": "user", "content": "grade"}])
        assert e.value.retryable  # the outbox retries the turn: a sleeping engine is no reason to drop it

    asyncio.run(scenario())
