"""A hand-written OpenAPI 3.0 document of the Proxy's routes, for schemathesis.

The Proxy's routes read raw `Request` bodies (it forwards them to vLLM's own OpenAI/Anthropic serving
layer, which validates them), so the schema FastAPI serves at `/openapi.json` has no request bodies and
would only fuzz paths. This document describes the bodies and headers clients actually send. Generation
is kept cheap on purpose (`max_tokens` <= 4, `n` <= 2, short texts): the fuzzer explores request shapes,
not the model.
"""

from __future__ import annotations

from typing import Any

SHORT = {"type": "string", "maxLength": 60}
TEXT_BLOCK = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"type": "string", "enum": ["text"]}, "text": SHORT}}
CONTENT = {"anyOf": [SHORT, {"type": "array", "maxItems": 2, "items": TEXT_BLOCK}, {"type": "null"}]}
TOOL_CALL = {"type": "object", "required": ["id", "type", "function"], "properties": {
    "id": SHORT, "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name", "arguments"],
                 "properties": {"name": SHORT, "arguments": SHORT}}}}
OPENAI_MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string", "enum": ["system", "user", "assistant", "tool", "developer"]},
    "content": CONTENT, "name": SHORT, "tool_call_id": SHORT,
    "tool_calls": {"type": "array", "maxItems": 2, "items": TOOL_CALL}}}
PARAMS = {"type": "object", "maxProperties": 3, "additionalProperties": {"type": "string", "maxLength": 20}}
OPENAI_TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]{0,20}$"}, "description": SHORT,
        "parameters": {"type": "object", "properties": {"type": {"type": "string", "enum": ["object"]},
                                                        "properties": PARAMS}}}}}}
EVAL_SPEC = {"type": "object", "properties": {
    "type": {"type": "string", "enum": ["multi_choice", "lowercase", "iso8601", "filename", "nonexistent"]},
    "options": {"type": "object", "maxProperties": 3, "additionalProperties": SHORT},
    "answer": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 2}},
    "threshold": {"type": "number"}}}
CLAWRAY_FIELDS = {
    "clawray_eval": EVAL_SPEC, "session_id": {"type": "string", "maxLength": 140},
    "turn_type": {"type": "string", "enum": ["main", "side", "MAIN", "other"]},
    "session_done": {"type": "boolean"}, "user_id": SHORT, "workspace_id": SHORT,
}
CHAT_BODY = {"type": "object", "required": ["messages"], "properties": {
    "model": {"type": "string", "enum": ["clawray-policy", "clawray-base", "policy-v9999", "other"]},
    "messages": {"type": "array", "minItems": 1, "maxItems": 4, "items": OPENAI_MESSAGE},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0.01, "maximum": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": 2},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "stop": {"anyOf": [SHORT, {"type": "array", "maxItems": 2, "items": SHORT}]},
    "seed": {"type": "integer"},
    "logprobs": {"type": "boolean"},
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 5},
    "tools": {"type": "array", "maxItems": 2, "items": OPENAI_TOOL},
    "tool_choice": {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]},
                              {"type": "object", "properties": {"type": {"type": "string", "enum": ["function"]},
                                                                "function": {"type": "object", "properties": {
                                                                    "name": SHORT}}}}]},
    "user": SHORT,
    **CLAWRAY_FIELDS,
}}
ANTHROPIC_BLOCK = {"anyOf": [TEXT_BLOCK, {"type": "object", "required": ["type", "tool_use_id"], "properties": {
    "type": {"type": "string", "enum": ["tool_result"]}, "tool_use_id": SHORT, "content": SHORT}},
    {"type": "object", "required": ["type", "id", "name", "input"], "properties": {
        "type": {"type": "string", "enum": ["tool_use"]}, "id": SHORT, "name": SHORT, "input": PARAMS}}]}
ANTHROPIC_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"type": "string", "enum": ["user", "assistant"]},
    "content": {"anyOf": [SHORT, {"type": "array", "maxItems": 2, "items": ANTHROPIC_BLOCK}]}}}
ANTHROPIC_TOOL = {"type": "object", "required": ["name", "input_schema"], "properties": {
    "name": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]{0,20}$"}, "description": SHORT,
    "input_schema": {"type": "object", "properties": {"type": {"type": "string", "enum": ["object"]},
                                                      "properties": PARAMS}}}}
SYSTEM = {"anyOf": [SHORT, {"type": "array", "maxItems": 2, "items": TEXT_BLOCK}]}
COUNT_BODY = {"type": "object", "required": ["model", "messages"], "properties": {
    "model": {"type": "string", "maxLength": 30},
    "messages": {"type": "array", "minItems": 1, "maxItems": 4, "items": ANTHROPIC_MESSAGE},
    "system": SYSTEM, "tools": {"type": "array", "maxItems": 2, "items": ANTHROPIC_TOOL}}}
MESSAGES_BODY = {"type": "object", "required": ["model", "max_tokens", "messages"], "properties": {
    **COUNT_BODY["properties"],
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4},
    "stream": {"type": "boolean"},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "top_p": {"type": "number", "minimum": 0.01, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 1, "maximum": 50},
    "stop_sequences": {"type": "array", "maxItems": 2, "items": SHORT},
    "tool_choice": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]}, "name": SHORT}},
    "metadata": {"type": "object", "properties": {"user_id": SHORT}},
    **CLAWRAY_FIELDS,
}}


def _header(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema}


# Session headers as clients send them; ids up to 140 characters (the proxy refuses more than 128).
SESSION_HEADERS = [
    _header("X-Session-Id", {"type": "string", "maxLength": 140}),
    _header("X-Turn-Type", {"type": "string", "enum": ["main", "side", "Side", "bogus", ""]}),
    _header("X-Session-Done", {"type": "string", "enum": ["true", "1", "no", "maybe"]}),
    _header("X-User-Id", {"type": "string", "maxLength": 140}),
    _header("X-Workspace-Id", SHORT),
]
AUTH_HEADERS = [_header("Authorization", SHORT), _header("x-api-key", SHORT)]
ADMIN_HEADER = [_header("X-Admin-Key", SHORT)]
OK = {"default": {"description": "any answer but a server error"}}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _op(params: list[dict], body: dict | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"parameters": params, "responses": OK}
    if body is not None:
        op["requestBody"] = _json_body(body)
    return op


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1,
                                                                      "maxLength": 80}}


def proxy_openapi() -> dict[str, Any]:
    """The document (OpenAPI 3.0.3) for the Proxy at the root path."""
    gen = SESSION_HEADERS + AUTH_HEADERS
    return {
        "openapi": "3.0.3",
        "info": {"title": "clawray proxy (hand-written for fuzzing)", "version": "0.1.0"},
        "paths": {
            "/v1/chat/completions": {"post": _op(gen, CHAT_BODY)},
            "/v1/messages": {"post": _op(gen, MESSAGES_BODY)},
            "/v1/messages/count_tokens": {"post": _op(AUTH_HEADERS, COUNT_BODY)},
            "/v1/models": {"get": _op(AUTH_HEADERS)},
            "/healthz": {"get": _op(AUTH_HEADERS + [_header("X-Request-Id", SHORT)])},
            "/v1/sessions/{session_id}/end": {"post": _op([_path_param("session_id"), *AUTH_HEADERS])},
            "/admin/adapters": {"get": _op(ADMIN_HEADER)},
            "/admin/adapters/{name}/load": {"post": _op([_path_param("name"), *ADMIN_HEADER])},
            "/admin/adapters/{name}/activate": {"post": _op([_path_param("name"), *ADMIN_HEADER])},
            "/admin/adapters/{name}": {"delete": _op([_path_param("name"), *ADMIN_HEADER])},
            "/admin/sessions/stats": {"get": _op(ADMIN_HEADER)},
        },
    }
