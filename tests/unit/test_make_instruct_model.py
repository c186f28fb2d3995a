"""The instruction-following model's trainer and eval (scripts/make_instruct_model.py, scripts/instruct_eval.py):
the targets are exactly the replies' tokens as served, batches keep few shapes, the loss is the reply's
cross-entropy, and the offline client reads tool calls as vLLM's hermes parser does."""

from __future__ import annotations

import random

import pytest
import torch

from harness.corpus import examples
from scripts.instruct_eval import LocalClient, parse_reply
from scripts.make_instruct_model import (
    BASE,
    DECISION_WEIGHT,
    PAD_TO,
    REPO,
    SOURCE_PARTS,
    batches,
    code_digest,
    collate,
    encode,
    new_model,
    reply_loss,
    resolve_precision,
)

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1}


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BASE)  # built by `make setup` (scripts/make_tiny_model.py)


def test_targets_are_the_replies_tokens_in_the_served_prompt(tok):
    exs = [e for e in examples(40, 2) if e.history_right][:10]
    assert exs
    for e in exs:
        seq, targets = encode(tok, e)
        served = tok.apply_chat_template(e.messages, add_generation_prompt=True, tokenize=False)
        assert tok.decode(seq) == served + e.reply + "<|im_end|>"
        # every earlier reply and the last one, each reply's first token (its decision) counted
        # DECISION_WEIGHT times: the loss is a mean over the listed positions
        replies = [m["content"] for m in e.messages if m["role"] == "assistant"] + [e.reply]
        distinct = sorted(set(targets))
        assert tok.decode([seq[t] for t in distinct]) == "".join(r + "<|im_end|>" for r in replies)
        assert targets == sorted(targets) and targets[-1] == len(seq) - 1
        counts = [targets.count(t) for t in distinct]
        assert sorted(set(counts)) == [1, DECISION_WEIGHT] and counts.count(DECISION_WEIGHT) == len(replies)
        _, last_only = encode(tok, e, history=False)
        assert tok.decode([seq[t] for t in sorted(set(last_only))]) == e.reply + "<|im_end|>"


def test_batches_cover_every_chat_once_in_few_shapes():
    rng = random.Random(0)
    data = [([1] * rng.randrange(5, 400), [3]) for _ in range(500)]
    out = batches(data, 2048, rng)
    assert sorted(j for b in out for j in b) == list(range(500))
    for b in out:
        lengths = {-(-len(data[j][0]) // PAD_TO) * PAD_TO for j in b}
        assert len(lengths) == 1 and len(b) <= max(1, 2048 // lengths.pop())
    ids, mask, rows, pos = collate([data[j] for j in out[0]], 0, 2048)
    assert ids.shape[0] * ids.shape[1] <= 2048 and ids.shape[1] % PAD_TO == 0 and len(pos) % PAD_TO == 0


def test_reply_loss_is_the_cross_entropy_of_the_targets(tok, monkeypatch):
    import scripts.make_instruct_model as build

    monkeypatch.setattr(build, "DECISION_WEIGHT", 1)  # every target once: HF's label loss is the same mean
    torch.manual_seed(0)
    model = new_model(BASE, SMALL)
    rows_in = [encode(tok, e) for e in examples(4, 3)]
    ids, mask, rows, pos = collate(rows_in, model.config.pad_token_id, 4096)
    labels = torch.full_like(ids, -100)
    labels[rows[pos > 0], pos[pos > 0]] = ids[rows[pos > 0], pos[pos > 0]]
    expected = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss, on_reply = reply_loss(model, ids, mask, rows, pos)
    assert torch.allclose(loss, expected, atol=1e-5) and torch.allclose(on_reply, expected, atol=1e-5)
    with_prompt, on_reply2 = reply_loss(model, ids, mask, rows, pos, prompt_weight=0.5)
    assert torch.allclose(on_reply2, expected, atol=1e-5) and with_prompt > on_reply2


def test_tool_calls_are_parsed_like_the_hermes_parser():
    msg = parse_reply('ok <tool_call>{"name": "write_file", "arguments": {"path": "a.md", "content": "x"}}</tool_call>')
    assert msg.content == "ok " and msg.tool_calls[0].function.name == "write_file"
    assert msg.tool_calls[0].model_dump()["function"]["arguments"] == '{"path": "a.md", "content": "x"}'
    bad = parse_reply("<tool_call>{not json</tool_call>")
    assert bad.tool_calls is None and bad.content == "<tool_call>{not json</tool_call>"


def test_the_offline_client_injects_skills_as_the_proxy_does(tok):
    import asyncio

    from harness.corpus import FAMILIES, skills_for

    skills = skills_for([FAMILIES["timestamp"][0]], random.Random(0))
    model = new_model(BASE, SMALL)
    client = LocalClient(model, tok, skills, greedy=True)
    msgs = [{"role": "system", "content": "You are Kit."},
            {"role": "user", "content": "Which timestamps follow our team standard? A. 2026-05-04T09:00:00Z"}]
    asyncio.run(client.chat.completions.create(messages=msgs, max_tokens=2))
    assert "You are Kit.\n\n## Active Skills\n\nApply the skills below" in client.prompts[0]
    assert skills[0].description in client.prompts[0]


@pytest.mark.parametrize("amx, avx512_bf16, want", [(True, False, "bf16"), (False, True, "bf16"),
                                                     (False, False, "fp32")])
def test_bf16_autocast_only_where_the_cpu_has_native_bf16(monkeypatch, amx, avx512_bf16, want):
    # Emulated bf16 (an AVX2-only CPU) trained at ~20 s a step against ~1 s in fp32: 5.5 hours for the build.
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert resolve_precision("auto") == want
    assert resolve_precision("fp32") == "fp32" and resolve_precision("bf16") == "bf16"


def test_the_build_fingerprint_ignores_prose_but_not_code():
    """Editing a docstring or a comment of the build's sources does not retrain the model; any code change does."""
    src = '"""Module."""\nimport math\n\n\ndef f(x):\n    """Doc."""\n    return math.sqrt(x)  # note\n'
    prose = src.replace("Module.", "Module, said better.").replace("Doc.", "").replace("# note", "# other")
    assert code_digest(prose) == code_digest(src)
    assert code_digest(src.replace("sqrt", "exp")) != code_digest(src)
    assert code_digest(src.replace('"""Doc."""', '"""Doc."""\n    x = 1')) != code_digest(src)


def test_of_a_serving_file_only_the_functions_the_build_calls_count():
    """serve/injection.py is mostly the Proxy's: editing what the build does not call must not retrain."""
    src = 'def add(x):\n    return x + 1\n\n\ndef serve(x):\n    return x\n'
    assert code_digest(src.replace("return x\n", "return -x\n"), only=("add",)) == code_digest(src, only=("add",))
    assert code_digest(src.replace("x + 1", "x + 2"), only=("add",)) != code_digest(src, only=("add",))
    with pytest.raises(ValueError, match="lack"):
        code_digest(src, only=("renamed",))
    for path, names in SOURCE_PARTS.items():  # every part the build names exists
        code_digest((REPO / path).read_text(), only=names)
