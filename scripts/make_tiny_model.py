"""Build the tiny chat model used on CPU machines and in tests: nothing is downloaded, nothing committed.

A byte-level BPE tokenizer (vocab 4096) is trained on the Python standard library's own sources (local,
sorted, so the result is deterministic for a given Python), wrapped as a `PreTrainedTokenizerFast` with a
ChatML template that renders system/user/assistant (incl. `tool_calls`) and tool messages in the Hermes
format (`<tool_call>{json}</tool_call>`), which vLLM's `hermes` tool parser reads back. The model is a
~1M-parameter Qwen2 with seeded random weights and POSITIONS positions: enough for a real agent's prompt
(Claude Code's alone is ~20k tokens). Qwen2 encodes positions with RoPE, so the number is config only: the
weights do not depend on it. The embedded default serves 2,048 of them (configs/local.yaml); agents run
with up to `CLAWRAY__MODEL__MAX_MODEL_LEN=65536` (Hermes refuses a window below 64K; docs/agents.md).

Usage: python scripts/make_tiny_model.py [--out .cache/tiny-chat] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / ".cache" / "tiny-chat"
SEED = 1234
VOCAB = 4096
POSITIONS = 65536  # the longest context the model may be served with (model.max_model_len)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (non-special) tokens: kept when decoding so the tool parser sees them.
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>"]

CHAT_TEMPLATE = r"""
{%- macro text(c) -%}
{%- if c is string -%}{{ c }}
{%- elif c is iterable -%}{%- for p in c -%}{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set sys = messages[0].role == 'system' -%}
{%- if tools -%}
<|im_start|>system
{% if sys %}{{ text(messages[0].content) }}

{% endif %}# Tools
You may call functions. Signatures:
<tools>
{%- for t in tools %}
{{ t | tojson }}
{%- endfor %}
</tools>
Reply with <tool_call>{"name": <name>, "arguments": <args>}</tool_call> to call one.<|im_end|>
{% elif sys -%}
<|im_start|>system
{{ text(messages[0].content) }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if loop.first and sys -%}
{%- elif m.role == 'user' or m.role == 'system' -%}
<|im_start|>{{ m.role }}
{{ text(m.content) }}<|im_end|>
{% elif m.role == 'assistant' -%}
<|im_start|>assistant
{% if m.content %}{{ text(m.content) }}{% endif -%}
{%- for tc in m.tool_calls or [] -%}
{%- set f = tc.function if tc.function is defined else tc -%}
<tool_call>{"name": "{{ f.name }}", "arguments": {% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}}</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ text(m.content) }}
</tool_response><|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
""".strip()


def _corpus(max_bytes: int = 3_000_000) -> list[str]:
    """Sorted stdlib sources (plus the chat markup) as training text: local and deterministic."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for f in sorted(stdlib.glob("*.py")):
        t = f.read_text(encoding="utf-8", errors="ignore")
        texts.append(t)
        total += len(t)
        if total > max_bytes:
            break
    texts.append(CHAT_TEMPLATE)
    return texts


def build_tokenizer(out: Path):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # The model is a Qwen2, so transformers' AutoTokenizer -- and vLLM, which loads it -- rebuild this
    # tokenizer as a Qwen2Tokenizer from its vocab and merges, with Qwen2's own normaliser and
    # pre-tokenisation (NFC, then Qwen2's split pattern, then byte-level). Trained with anything else (the
    # plain GPT-2 byte-level split it once had), the engine's token ids differ from `tokenizer.json`'s, and
    # whatever reads that file (the PRM's token counter, an OPD teacher check) disagrees with the engine.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(ADDED)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = POSITIONS
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    cfg = Qwen2Config(
        vocab_size=VOCAB + 64,  # room for the added tokens, rounded up
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=POSITIONS,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, do_sample=True
    ).save_pretrained(out)


def _fingerprint() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def is_built(out: Path) -> bool:
    stamp = out / "clawray-build.json"
    try:
        return json.loads(stamp.read_text())["fingerprint"] == _fingerprint()
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return False


def build_into(out: Path, build) -> Path:
    """Run `build(tmp)` in a temporary folder beside `out`, then rename it into place: a crash or an
    interrupt leaves the previous build (or none), never a half-written one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        build(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def make(out: Path = DEFAULT_OUT, force: bool = False) -> Path:
    """Build into `out` (atomically, `build_into`). Idempotent."""
    if is_built(out) and not force:
        return out

    def build(tmp: Path) -> None:
        build_model(tmp, build_tokenizer(tmp))
        (tmp / "clawray-build.json").write_text(json.dumps({"fingerprint": _fingerprint(), "seed": SEED}))

    return build_into(out, build)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    was = is_built(args.out)
    path = make(args.out, args.force)
    print(f"tiny model {'already built' if was and not args.force else 'built'}: {path}")


if __name__ == "__main__":
    main()
