"""On-policy distillation (optional): the teacher's logprobs of the tokens the policy sampled.

Only meaningful when the teacher tokenizes exactly like the policy, so this is checked, not assumed:
`verify_same_tokenizer` sends probe strings to the teacher's `/tokenize` route (vLLM's, at the server
root) and compares the ids with the policy's own tokenizer (a local folder). Any difference, or a
teacher without that route (hosted APIs), is a ConfigError: OPD is refused rather than trained on
misaligned logprobs.

NOTE: a probe-based check. Two tokenizers that agree on every probe but differ elsewhere would pass;
the probes cover ASCII, code and indentation, non-Latin scripts, emoji, timestamps and chat special
tokens, where real tokenizer families differ.
"""

from __future__ import annotations

from collections.abc import Callable

from core.config import ConfigError
from core.contracts import Turn
from core.llm import LLMClient, LLMError
from rewards.errors import TeacherUnavailable

PROBES = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x ** 2  # square\n\tpass",
    "Ünïcödé — 日本語のテキスト, русский текст, 🙂🚀",
    "[DONE] 2026-03-16T09:30:00+08:00 | task_42 | shipped v2.3.0",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
)


async def verify_same_tokenizer(
    teacher: LLMClient, policy_encode: Callable[[str], list[int]], probes: tuple[str, ...] = PROBES
) -> None:
    """ConfigError if the teacher's ids differ from `policy_encode` on any probe or cannot be read;
    TeacherUnavailable if the teacher is (transiently) unreachable."""
    for probe in probes:
        try:
            theirs = await teacher.tokenize(probe)
        except LLMError as e:
            if e.retryable:
                raise TeacherUnavailable(f"cannot reach the OPD teacher to check its tokenizer: {e}") from None
            raise ConfigError(
                f"rewards.teacher: cannot verify the teacher's tokenizer ({e}); OPD needs a teacher "
                "that serves vLLM's /tokenize route"
            ) from None
        ours = policy_encode(probe)
        if theirs != ours:
            raise ConfigError(
                f"rewards.teacher: {teacher.where} tokenizes {probe[:40]!r} as {theirs[:8]}... but the "
                f"policy as {ours[:8]}...; OPD needs the teacher to use the policy's tokenizer"
            )


async def teacher_logprobs(teacher: LLMClient, turn: Turn) -> list[float]:
    """(R,) teacher logprobs of `turn.response_ids` given `turn.prompt_ids`."""
    try:
        return await teacher.completion_logprobs(turn.prompt_ids, turn.response_ids)
    except LLMError as e:
        raise TeacherUnavailable(f"OPD teacher logprobs failed: {e}") from None
