"""Judge prompt: sanitizing, next state on/off, and token-budget truncation."""

import pytest

from core.contracts import Turn
from rewards.judge import WEIGHTS, allocate, build_judge_messages, sanitize, turn_parts
from rewards.tokens import WhitespaceTokens, load_tokens


def make_turn(**kw):
    base = dict(
        session_id="s", turn_index=0, prompt_ids=[1, 2], response_ids=[3, 4], response_logprobs=[-0.1, -0.2],
        messages=[{"role": "system", "content": "You are helpful. SKILL: back up files."},
                  {"role": "user", "content": "Update config.py"}],
        response_text="Done, I updated it.",
        next_state=[{"role": "user", "content": "You forgot the .bak backup!"}],
    )
    return Turn(**{**base, **kw})


@pytest.mark.parametrize("raw, clean", [
    ("<think>secret plan</think>The answer is 4.", "The answer is 4."),
    ("plan from the prompt's open think</think>Answer", "Answer"),
    ("Answer <think>never closed", "Answer [unfinished reasoning omitted]"),
    ("<|im_start|>assistant\nHi<|im_end|><|endoftext|>", "assistant\nHi"),
    ("[INST] x [/INST] </s>", "x"),
    ("<tool_call>{\"name\": \"f\"}</tool_call>", "{\"name\": \"f\"}"),
    ("bell\x07 ok\n", "bell ok"),
])
def test_sanitize(raw, clean):
    assert sanitize(raw) == clean


def test_prompt_holds_instruction_response_tool_calls_and_next_state():
    turn = make_turn(tool_calls=[{"id": "1", "type": "function",
                                  "function": {"name": "write_file", "arguments": "{\"path\": \"config.py\"}"}}],
                     response_text="<think>hmm</think>Done.")
    system, user = build_judge_messages(turn, tokens=WhitespaceTokens(), budget=1000)
    assert system["role"] == "system" and "Score: 1" in system["content"]
    body = user["content"]
    assert "Update config.py" in body and "back up files" in body
    assert "[tool call] write_file({\"path\": \"config.py\"})" in body
    assert "You forgot the .bak backup!" in body and "## Next state" in body
    assert "hmm" not in body and "<think>" not in body


def test_next_state_can_be_configured_off():
    _, user = build_judge_messages(make_turn(), tokens=WhitespaceTokens(), budget=1000, use_next_state=False)
    assert "forgot" not in user["content"] and "Next state" not in user["content"]


def test_missing_next_state_is_said_explicitly():
    _, user = build_judge_messages(make_turn(next_state=None), tokens=WhitespaceTokens(), budget=1000)
    assert "nothing followed this turn" in user["content"]


def test_agent_loop_context_after_last_user_message():
    turn = make_turn(messages=[
        {"role": "user", "content": "List files"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "name": "ls", "content": [{"type": "text", "text": "a.txt b.txt"}]},
    ])
    instruction = turn_parts(turn, True)["instruction"]
    assert "[user] List files" in instruction and "[tool call] ls({})" in instruction
    assert "[tool result ls] a.txt b.txt" in instruction


@pytest.mark.parametrize("needs, budget", [
    ({"system": 10, "instruction": 10, "response": 10, "next_state": 10}, 100),
    ({"system": 500, "instruction": 10, "response": 900, "next_state": 40}, 200),
    ({"system": 0, "instruction": 3000, "response": 3000, "next_state": 3000}, 64),
    ({"system": 1, "instruction": 1, "response": 1, "next_state": 1}, 2),
])
def test_allocate_invariants(needs, budget):
    out = allocate(needs, budget, WEIGHTS)
    assert all(out[k] <= needs[k] for k in needs)
    assert sum(out.values()) <= budget
    if sum(needs.values()) <= budget:
        assert out == needs


def test_allocate_gives_unused_share_to_long_parts():
    out = allocate({"system": 5, "instruction": 5, "response": 1000, "next_state": 1000}, 400, WEIGHTS)
    assert out["system"] == 5 and out["instruction"] == 5
    assert out["response"] + out["next_state"] >= 385


def long_turn(n):
    words = lambda tag: " ".join(f"{tag}{i}" for i in range(n))  # noqa: E731
    return make_turn(
        messages=[{"role": "system", "content": words("sys")}, {"role": "user", "content": words("ask")}],
        response_text=words("resp"),
        next_state=[{"role": "user", "content": "VERDICT-FIRST " + words("fb")}],
    )


def test_budget_caps_parts_in_whitespace_tokens():
    tokens = WhitespaceTokens()
    turn = long_turn(2000)
    _, user = build_judge_messages(turn, tokens=tokens, budget=400)
    fixed = build_judge_messages(make_turn(messages=[], response_text="", next_state=None),
                                 tokens=tokens, budget=400)[1]["content"]
    assert tokens.count(user["content"]) <= 400 + tokens.count(fixed) + 4 * 5  # + labels per part
    body = user["content"]
    assert "tokens cut" in body
    assert "VERDICT-FIRST" in body  # next state keeps its head
    assert "ask1999" in body  # the instruction keeps its tail (the actual request)
    assert "resp0 " in body and "resp1999" in body  # the response keeps both ends


@pytest.fixture(scope="module")
def hf_tokenizer_path(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 20, "def f(x): return x"], trainer)
    path = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>").save_pretrained(path)
    return str(path)


def test_budget_is_counted_in_real_tokenizer_tokens(hf_tokenizer_path):
    tokens = load_tokens(hf_tokenizer_path)
    text = "the quick brown fox " * 200
    assert tokens.count(text) > len(text.split())  # real tokens, not words
    for keep in ("head", "tail", "middle"):
        cut = tokens.truncate(text, 60, keep)
        assert tokens.count(cut) <= 60 + 2  # decode/re-encode may merge at the cut
        assert "tokens cut" in cut
    turn = long_turn(500)
    _, user = build_judge_messages(turn, tokens=tokens, budget=300)
    assert tokens.count(user["content"]) < 300 + 200  # the parts are capped; the template is extra
    assert tokens.count(user["content"]) < tokens.count(" ".join(turn_parts(turn, True).values()))
