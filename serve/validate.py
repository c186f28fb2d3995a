"""Request checks the OpenAI and Anthropic APIs make and vLLM does not (pure; `RequestError` -> a 400).

vLLM's chat layer takes any message role (its custom-role extension), and its Responses layer answers an
unknown input item with a pile of union errors; OpenAI and Anthropic refuse both with one clear message.
These checks run at the Proxy before anything reads the conversation, so a malformed request is refused
in the client's own error shape whatever the engine (vLLM or upstream), and changes nothing.

Known values: the request types of the `openai` (3.57) and `anthropic` (2.14) SDKs, plus the content part
types vLLM's renderer also accepts (its extensions), so nothing vLLM serves today is refused. A known type
this engine cannot render (an OpenAI `file` part, an Anthropic `document` block) is left to the engine,
which refuses it by name. Parts without a `type` are left to the engine too (vLLM reads `{"image_url":
...}` parts by their key). The fields the Proxy itself reads before the engine (`tools`, Anthropic's
`system`, a text part's `text`) are checked for their shape here: the context fitter counts them, and a
`"tools": 7` reaching it was a 500 (found by the CI fuzz run; tests/unit/test_proxy_hostile_bodies.py).
"""

from __future__ import annotations

from typing import Any

from serve.http import require_messages
from serve.turns import RequestError

OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
OPENAI_PART_TYPES = frozenset({
    "text", "image_url", "input_audio", "file", "refusal",  # OpenAI's
    # vLLM's extensions (renderers/chat_utils.py MM_PARSER_MAP)
    "audio_url", "video_url", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds",
    "input_text", "output_text", "input_image", "thinking", "tool_reference",
})
ANTHROPIC_ROLES = ("user", "assistant", "system")
ANTHROPIC_BLOCK_TYPES = frozenset({
    "text", "image", "document", "search_result", "thinking", "redacted_thinking", "tool_use", "tool_result",
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
    "bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "tool_search_tool_result",
    "container_upload",
    "tool_reference", "tool_addition", "tool_removal",  # vLLM's (anthropic/protocol.py)
})
ANTHROPIC_SYSTEM_TYPES = frozenset({"text"})
ANTHROPIC_TOOL_RESULT_TYPES = frozenset({"text", "image", "search_result", "document", "tool_reference",
                                         "browser_state"})
TEXT_TYPES = frozenset({"text", "input_text", "output_text"})  # parts whose `text` is the content
RESPONSES_ITEM_TYPES = frozenset({
    "message", "file_search_call", "computer_call", "computer_call_output", "web_search_call",
    "function_call", "function_call_output", "tool_search_call", "tool_search_output", "additional_tools",
    "configuration_update", "reasoning", "compaction", "image_generation_call", "code_interpreter_call",
    "local_shell_call", "local_shell_call_output", "shell_call", "shell_call_output", "apply_patch_call",
    "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "mcp_call",
    "custom_tool_call_output", "custom_tool_call", "compaction_trigger", "item_reference", "program",
    "program_output",
})
RESPONSES_ROLES = ("user", "assistant", "system", "developer")
RESPONSES_PART_TYPES = frozenset({"input_text", "input_image", "input_file", "output_text", "refusal"})
# Responses state clawray does not keep (it stores no responses, and vLLM's store is in-memory, per replica).
STATELESS_HINT = ("clawray does not store responses: send the whole conversation in `input` (the earlier "
                  "input items followed by the previous response's `output` items) and `store: false`")


def _one_of(values: Any) -> str:
    return ", ".join(repr(v) for v in sorted(values))


def _check_type(where: str, part: Any, known: frozenset[str], what: str) -> None:
    if isinstance(part, str):
        return  # a bare string part: the engine reads it as text
    if not isinstance(part, dict):
        raise RequestError(f"{where} must be an object")
    kind = part.get("type")
    if kind is None:
        return
    if not isinstance(kind, str) or kind not in known:
        raise RequestError(f"{where}.type: invalid value {kind!r}: not a known {what} type. "
                           f"Supported values are: {_one_of(known)}")
    if kind in TEXT_TYPES and not isinstance(part.get("text"), str):
        raise RequestError(f"{where}.text: a {kind} {what} needs its text as a string")


def _check_content(where: str, content: Any, known: frozenset[str], what: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or an array of {what}s")
    for j, part in enumerate(content):
        _check_type(f"{where}[{j}]", part, known, what)


def _check_tools(body: dict[str, Any], chat: bool = False) -> None:
    """`tools`, when sent, is an array of tool objects (all three APIs). A chat completions function tool
    (`type` "function", vLLM's default when absent) has a `function` object with a string `name`: vLLM's
    own check of `tool_choice` reads `tool["function"]["name"]` before its schema does, and a tool without
    one was a KeyError there, a 500 (found by the CI fuzz run). The engine now answers that with a 400 too
    (serve/vllm_engine.py `_validate`), but a vLLM *upstream* of an older version still answers 500, which
    upstream mode retries as transient and then reports as a 502: refused here, it is one clean 400 whatever
    the engine. Other tool types are the engine's to judge."""
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise RequestError("tools must be an array of tool objects")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(f"tools[{i}] must be an object")
        if chat and tool.get("type", "function") == "function":
            _check_function_tool(f"tools[{i}]", tool)


def _check_function_tool(where: str, tool: dict[str, Any]) -> None:
    function = tool.get("function")
    if function is None:
        raise RequestError(f"Missing required parameter: '{where}.function'.")  # OpenAI's words
    if not isinstance(function, dict):
        raise RequestError(f"{where}.function must be an object")
    if function.get("name") is None:
        raise RequestError(f"Missing required parameter: '{where}.function.name'.")
    if not isinstance(function["name"], str):
        raise RequestError(f"{where}.function.name must be a string")


def _check_model(body: dict[str, Any]) -> None:
    """`model` is a string in both APIs (absent or null: the policy). Another value reached the engine's
    adapter lookup, which hashed it: a 500 (found by the CI fuzz run: `"model": []`)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"model: Input should be a valid string, not {type(model).__name__}")


def check_chat(body: dict[str, Any]) -> None:
    """OpenAI chat completions: `messages`, each with a known role and known content part types."""
    require_messages(body)
    _check_model(body)
    _check_tools(body, chat=True)
    for i, m in enumerate(body["messages"]):
        if m["role"] not in OPENAI_ROLES:
            raise RequestError(f"messages[{i}].role: invalid value {m['role']!r}. "
                               f"Supported values are: {_one_of(OPENAI_ROLES)}")
        _check_content(f"messages[{i}].content", m.get("content"), OPENAI_PART_TYPES, "content part")


def check_messages(body: dict[str, Any]) -> None:
    """Anthropic messages (and count_tokens): known roles and content block types, tool results included;
    `system` as text or text blocks."""
    require_messages(body)
    _check_model(body)
    _check_tools(body)
    _check_content("system", body.get("system"), ANTHROPIC_SYSTEM_TYPES, "system block")
    for i, m in enumerate(body["messages"]):
        if m["role"] not in ANTHROPIC_ROLES:
            raise RequestError(f"messages.{i}.role: invalid value {m['role']!r}. "
                               f"Supported values are: {_one_of(ANTHROPIC_ROLES)}")
        content = m.get("content")
        where = f"messages.{i}.content"
        _check_content(where, content, ANTHROPIC_BLOCK_TYPES, "content block")
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                _check_content(f"{where}.{j}.content", block.get("content"), ANTHROPIC_TOOL_RESULT_TYPES,
                               "tool result block")


def check_responses(body: dict[str, Any]) -> None:
    """OpenAI Responses: `input` as text or known items (messages with known roles and part types);
    server-side conversation state is refused with how to send the conversation instead."""
    for field in ("previous_response_id", "conversation"):
        if body.get(field) is not None:
            raise RequestError(f"{field} is not supported: {STATELESS_HINT}")
    _check_model(body)
    _check_tools(body)
    items = body.get("input")
    if items is None:
        raise RequestError("'input' is required")
    if isinstance(items, str):
        return
    if not isinstance(items, list):
        raise RequestError("'input' must be a string or an array of input items")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RequestError(f"input[{i}] must be an object")
        kind = item.get("type")
        if kind is None:  # typeless: an easy input message, or an item reference (`{"id": ...}`)
            kind = "message" if "role" in item else "item_reference" if "id" in item else None
        if kind == "item_reference":
            raise RequestError(f"input[{i}]: item references are not supported: {STATELESS_HINT}")
        if kind not in RESPONSES_ITEM_TYPES:
            raise RequestError(f"input[{i}].type: invalid value {kind!r}: not a known input item type. "
                               f"Supported values are: {_one_of(RESPONSES_ITEM_TYPES)}")
        if kind == "message":
            if item.get("role") not in RESPONSES_ROLES:
                raise RequestError(f"input[{i}].role: invalid value {item.get('role')!r}. "
                                   f"Supported values are: {_one_of(RESPONSES_ROLES)}")
            _check_content(f"input[{i}].content", item.get("content"), RESPONSES_PART_TYPES, "content part")
