"""The tiny model's tokenizer gives the same ids however it is loaded: by vLLM (the engine: token exactness
starts there), by transformers' AutoTokenizer (the trainer, the instruction model's build) and straight
from `tokenizer.json` (rewards/tokens.py: the PRM's counter and the OPD teacher check). A real vLLM teacher
serving the same folder once failed that check because the first two rebuilt it as a Qwen2Tokenizer while
the file had been trained with another pre-tokenizer."""

from __future__ import annotations

import pytest

from core.config import load_config
from rewards.opd import PROBES
from rewards.tokens import load_tokens

TEXTS = (*PROBES, "def f(x):\n    return x\n\n\n        pass", "Café déjà vu", "tabs\t\tand  spaces   ",
         "<|im_start|>system\nYou are Rio.<|im_end|>\n")


@pytest.fixture(scope="module")
def path() -> str:
    return load_config(None).model_path()


def test_every_reader_of_the_tiny_tokenizer_agrees_with_the_engine(path):
    from transformers import AutoTokenizer
    from vllm.tokenizers import get_tokenizer

    engine, hf, raw = get_tokenizer(path), AutoTokenizer.from_pretrained(path), load_tokens(path)
    for text in TEXTS:
        want = engine.encode(text, add_special_tokens=False)
        assert hf.encode(text, add_special_tokens=False) == want, text
        assert raw.encode(text) == want, text
