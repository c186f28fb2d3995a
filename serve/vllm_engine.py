"""vLLM hosted in-process with its own OpenAI and Anthropic serving objects (no Ray here).

We do not re-implement chat templates, tool parsing or streaming formats: `init_app_state` builds vLLM's
`OpenAIServingChat`, `OpenAIServingResponses`, `AnthropicServingMessages` and `OpenAIServingModels`
exactly as `vllm serve` does, around a `TappedEngineClient` that captures token ids, logprobs and
sampling parameters (see capture.py). The engine reports processed logprobs (`--logprobs-mode
processed_logprobs`): the sampling distribution's. Responses streams are framed as `vllm serve` frames
them (its router's SSE converter). vLLM keeps no responses (its store is off: in-memory, per replica, never
freed), so `previous_response_id` is refused at the Proxy (serve/validate.py).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from core.config import EngineConfig, ModelConfig
from serve.budget import OUTPUT_FIELDS, cap_output_request, clamp_output_request, context_full_message
from serve.capture import Capture, TappedEngineClient
from serve.protocol import EngineRequestError, Reply

log = logging.getLogger("clawray.engine")
VLLM_DIR_PREFIX = "cr-vllm-"  # the private temp folder of one engine (core/private_tmp.py)


def vllm_private_dir() -> Path | None:
    """A private temp folder for a vLLM engine about to start (its process and the engine core process it
    spawns: `vllm_temp_env`), after sweeping those of engines that are gone. vLLM puts its ZMQ IPC sockets
    (`VLLM_RPC_BASE_PATH`, default the temp dir) and its engine core's torch FileStore
    (`tempfile.gettempdir()`) straight into /tmp, and an engine that is killed (a replica's shutdown,
    `ray.kill`, a crash) never removes them: thousands had piled up. None when the operator set
    `VLLM_RPC_BASE_PATH` themselves (theirs is used, and nothing is swept)."""
    from core.private_tmp import make_private_dir, sweep_stale_dirs, temp_parent

    if os.environ.get("VLLM_RPC_BASE_PATH"):
        return None
    parent = temp_parent()
    for gone in sweep_stale_dirs(parent, VLLM_DIR_PREFIX):
        log.info("removed %s, left by a vLLM engine that is gone", gone)
    return make_private_dir(VLLM_DIR_PREFIX, parent)


def vllm_temp_env(private: Path | None) -> dict[str, str]:
    """The env that puts a vLLM process's sockets and temp files into `private` (nothing for None)."""
    return {} if private is None else {"VLLM_RPC_BASE_PATH": str(private), "TMPDIR": str(private)}


def vllm_cli_args(model_path: str, model: ModelConfig, engine: EngineConfig) -> list[str]:
    """The `vllm serve` flags for our config: the same parser, so every vLLM option stays reachable."""
    args = [
        "--model", model_path,
        "--served-model-name", model.served_name,
        "--dtype", model.dtype,
        "--max-model-len", str(model.max_model_len),
        "--enable-lora",
        "--max-loras", str(engine.max_loras),
        "--max-lora-rank", str(engine.max_lora_rank),
        "--max-cpu-loras", str(engine.max_cpu_loras),
        "--enable-auto-tool-choice",
        "--tool-call-parser", engine.tool_call_parser,
        "--disable-log-stats",
        "--enable-prefix-caching",
        # Logprobs of the distribution each token was sampled from (after temperature, top-k, top-p),
        # not the raw model's: the trainer's importance ratio divides by them (serve/capture.py).
        "--logprobs-mode", "processed_logprobs",
    ]
    if engine.default_temperature is not None:
        # vLLM's server-wide default for requests that send no temperature (a request's own value wins);
        # merged over the model's generation_config.json. The engine reports the temperature it applied.
        args += ["--override-generation-config", json.dumps({"temperature": engine.default_temperature})]
    if engine.enforce_eager:
        args.append("--enforce-eager")
    if engine.share_gpu_with_training == "sleep":  # the engine sleeps while a run trains on its GPU
        args.append("--enable-sleep-mode")
    if engine.device == "gpu":
        args += ["--gpu-memory-utilization", str(engine.gpu_memory_utilization)]
    else:
        # No chunked prefill on CPU: when a step's token budget cuts a seeded request's prefill, vLLM
        # discards the token sampled for it and rewinds the request's generator (`set_offset`), which a
        # CPU generator cannot do ("CPU Generator does not use offset"): the engine core dies. Concurrent
        # seeded groups (train/rollouts.py) hit it every evening. Without chunking a prefill is scheduled
        # whole (vLLM raises max_num_batched_tokens to max_model_len). tests/integration/test_serve_seeded_groups.py
        args.append("--no-enable-chunked-prefill")
    return args


class VLLMServing:
    """One vLLM engine plus vLLM's serving layer. Call `await start()` once."""

    def __init__(self, model_path: str, model: ModelConfig, engine: EngineConfig):
        self.model_path, self.model_cfg, self.engine_cfg = model_path, model, engine
        self._stack = AsyncExitStack()
        self.client: TappedEngineClient | None = None
        self.state: Any = None

    async def start(self) -> None:
        if self.engine_cfg.device == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.engine_cfg.kv_cache_gib))
        # Before vLLM starts: its engine core process inherits it. Nothing closes an engine when its replica
        # stops, so the folder is removed by a later engine start's sweep, once no socket in it answers.
        os.environ.update(vllm_temp_env(vllm_private_dir()))
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(
            vllm_cli_args(self.model_path, self.model_cfg, self.engine_cfg)
        )
        inner = await self._stack.enter_async_context(build_async_engine_client(args))
        self.client = TappedEngineClient(inner)
        self.state = State()
        tasks = await inner.get_supported_tasks()
        await init_app_state(self.client, self.state, args, supported_tasks=tasks)

    async def close(self) -> None:
        await self._stack.aclose()

    # ---- requests -------------------------------------------------------------------------------

    def _fit(self, body: dict[str, Any], api: str) -> dict[str, Any]:
        """`body` with an output-token limit above the context lowered to it (`engine.clamp_max_tokens`):
        vLLM would refuse it; lowered, vLLM grants what the rendered prompt leaves (serve/budget.py)."""
        if self.engine_cfg.clamp_max_tokens:
            clamp_output_request(body, OUTPUT_FIELDS[api], self.model_cfg.max_model_len)
        if self.engine_cfg.max_output_tokens is not None:
            cap_output_request(body, OUTPUT_FIELDS[api], self.engine_cfg.max_output_tokens)
        return body

    def _chat_request(self, body: dict[str, Any]):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return _validate(ChatCompletionRequest, self._fit(body, "chat"))

    def _anthropic_request(self, body: dict[str, Any]):
        from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest

        req = _validate(AnthropicMessagesRequest, self._fit(body, "messages"))
        serving = self.state.anthropic_serving_messages
        return serving.to_chat_completion_request(
            req, merge_inline_system=serving._merge_inline_system
        )

    def _responses_request(self, body: dict[str, Any]):
        from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

        return _validate(ResponsesRequest, self._fit(body, "responses"))

    async def _run_chat(self, serving: Any, chat_req: Any) -> tuple[Any, Capture, str]:
        limit = chat_req.max_completion_tokens
        limit = chat_req.max_tokens if limit is None else limit
        return await self._run(serving.create_chat_completion, chat_req, limit)

    async def _run(self, create: Any, req: Any, limit: int | None,
                   prefix: str = "") -> tuple[Any, Capture, str]:
        """`await create(req, None)` (a vLLM serving entry point) with a capture registered under a fresh
        key, which becomes the request id (after `prefix`); refusals raise `EngineRequestError`."""
        key = uuid.uuid4().hex
        req.request_id = prefix + key
        cap = self.client.register(key)
        try:
            result = await create(req, None)
        except _client_errors() as e:
            self.client.release(key)
            raise refusal(e, limit, self.model_cfg.max_model_len) from None
        if _is_error(result):
            self.client.release(key)
            err = result.error
            raise EngineRequestError(int(err.code), err.message, err.type)
        return result, cap, key

    async def chat(self, body: dict[str, Any]) -> Reply:
        chat_req = self._chat_request(body)
        result, cap, key = await self._run_chat(self.state.openai_serving_chat, chat_req)
        self.client.release(key)
        return Reply(result.model_dump(mode="json", exclude_none=True), cap, body["messages"])

    async def chat_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        """Yields vLLM's SSE strings as they come, then one final `Reply` (body empty)."""
        chat_req = self._chat_request(body)
        gen, cap, key = await self._run_chat(self.state.openai_serving_chat, chat_req)
        try:
            async for chunk in gen:
                yield chunk
        finally:
            self.client.release(key)
        yield Reply({}, cap, body["messages"])

    async def messages(self, body: dict[str, Any]) -> Reply:
        serving = self.state.anthropic_serving_messages
        chat_req = self._anthropic_request(body)
        result, cap, key = await self._run_chat(serving, chat_req)
        self.client.release(key)
        out = serving.messages_full_converter(result)
        return Reply(out.model_dump(mode="json", exclude_none=True), cap, _dump_messages(chat_req))

    async def messages_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        serving = self.state.anthropic_serving_messages
        chat_req = self._anthropic_request(body)
        gen, cap, key = await self._run_chat(serving, chat_req)
        try:
            async for chunk in serving.message_stream_converter(gen):
                yield chunk
        finally:
            self.client.release(key)
        yield Reply({}, cap, _dump_messages(chat_req))

    async def responses(self, body: dict[str, Any]) -> Reply:
        serving = self.state.openai_serving_responses
        req = self._responses_request(body)
        result, cap, key = await self._run(serving.create_responses, req, req.max_output_tokens, "resp_")
        self.client.release(key)
        return Reply(result.model_dump(mode="json", by_alias=True), cap, _responses_messages(req))

    async def responses_stream(self, body: dict[str, Any]) -> AsyncGenerator[str | Reply, None]:
        from vllm.entrypoints.openai.responses.api_router import _convert_stream_to_sse_events

        serving = self.state.openai_serving_responses
        req = self._responses_request(body)
        gen, cap, key = await self._run(serving.create_responses, req, req.max_output_tokens, "resp_")
        try:
            async for event in _convert_stream_to_sse_events(gen):
                yield event
        finally:
            self.client.release(key)
        yield Reply({}, cap, _responses_messages(req))

    async def complete(self, body: dict[str, Any]) -> Reply:
        """OpenAI completions on a prompt of token ids (`"prompt": [ids]`), through vLLM's own completion
        serving (generation-config defaults, the adapter by model name, `n` choices): the re-sampled GRPO
        groups of a training window (train/rollouts.py) answer exactly the prompt a user was served.
        Not an HTTP route: only the Controller calls it, through the deployment handle."""
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        req = _validate(CompletionRequest, body)
        result, cap, key = await self._run(self.state.openai_serving_completion.create_completion, req,
                                           req.max_tokens, prefix="cmpl-")
        self.client.release(key)
        return Reply(result.model_dump(mode="json", exclude_none=True), cap, [])

    async def count_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        """Anthropic `count_tokens`: vLLM renders the prompt exactly as `messages` would."""
        from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest

        req = _validate(AnthropicCountTokensRequest, body)
        try:
            res = await self.state.anthropic_serving_messages.count_tokens(req, None)
        except _client_errors() as e:  # rendering refused the messages: a 400, as for `messages` (fuzzing)
            raise EngineRequestError(400, str(e)) from None
        if _is_error(res):
            raise EngineRequestError(int(res.error.code), res.error.message, res.error.type)
        return {"input_tokens": res.input_tokens}

    # ---- LoRA -----------------------------------------------------------------------------------

    async def add_lora(self, name: str, path: str) -> None:
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        res = await self.state.openai_serving_models.load_lora_adapter(
            LoadLoRAAdapterRequest(lora_name=name, lora_path=path)
        )
        if _is_error(res):
            raise EngineRequestError(int(res.error.code), res.error.message, res.error.type)

    async def remove_lora(self, name: str) -> None:
        """Free the engine's slot, then forget the name in the serving layer. Idempotent: a retry after
        a partial failure finishes the job (the name, and so the slot's id, is forgotten last)."""
        from vllm.entrypoints.serve.lora.protocol import UnloadLoRAAdapterRequest

        models = self.state.openai_serving_models
        lora = models.lora_requests.get(name)
        if lora is None:
            return  # already unloaded
        await self.client.remove_lora(lora.lora_int_id)
        res = await models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=name))
        if _is_error(res):
            raise EngineRequestError(int(res.error.code), res.error.message, res.error.type)

    # ---- sleep mode (engine.share_gpu_with_training: sleep) ----------------------------------------

    async def sleep(self) -> None:
        """vLLM sleep level 1: the weights go to CPU memory, the KV cache (and prefix cache) is freed.
        Requests still running are aborted: the caller lets them finish first (serve/sleep_gate.py).
        Level 2 would drop the weights, and waking would need them loaded again."""
        await self.client.sleep(level=1)

    async def wake_up(self) -> None:
        """Weights back on the GPU, KV cache allocated again; raises if vLLM reports memory still asleep."""
        if not await self.client.wake_up(None):
            raise RuntimeError("vLLM woke only partly: some of its GPU memory is still asleep")

    def tokenizer(self) -> Any:
        return self.state.openai_serving_chat.renderer.tokenizer


def _validate(model: Any, body: dict[str, Any]) -> Any:
    """`model.model_validate(body)` with every client mistake as a 400 (first error only, no input echo)."""
    from pydantic import ValidationError

    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise EngineRequestError(400, _first_error(e)) from None
    except _client_errors() as e:  # vLLM's own validators raise VLLMClientError
        raise EngineRequestError(400, str(e)) from None
    except KeyError as e:  # a "before" validator indexing the client's raw JSON (vLLM's check_tool_usage did)
        raise EngineRequestError(400, f"the request is malformed: a required field is missing ({e})") from None


def _client_errors() -> tuple[type[Exception], ...]:
    from vllm.exceptions import VLLMClientError

    return (ValueError, TypeError, VLLMClientError)


def _is_error(obj: Any) -> bool:
    return type(obj).__name__ == "ErrorResponse"


def _first_error(e: Any) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg"))


def refusal(e: Exception, limit: int | None, context_len: int) -> EngineRequestError:
    """A request vLLM refused, as a 400. A prompt that takes the whole context reaches vLLM's sampling
    parameters as `max_tokens` 0 (nothing left), which vLLM reports only as "max_tokens must be at least
    1": unless the client itself asked for 0 (`limit`), say what happened."""
    if getattr(e, "parameter", None) == "max_tokens" and getattr(e, "value", None) == 0 and limit != 0:
        return EngineRequestError(400, context_full_message(context_len))
    return EngineRequestError(400, str(e))


def _responses_messages(req: Any) -> list[dict[str, Any]]:
    """The conversation a Responses request rendered, as chat messages: vLLM's own conversion of its
    `instructions` and `input` (there is no previous response: the Proxy refuses `previous_response_id`)."""
    from pydantic_core import to_jsonable_python
    from vllm.entrypoints.openai.responses.utils import construct_input_messages

    return to_jsonable_python(construct_input_messages(request_instructions=req.instructions,
                                                       request_input=req.input))


def _dump_messages(chat_req: Any) -> list[dict[str, Any]]:
    return [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in chat_req.messages]

