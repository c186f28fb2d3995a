import pytest
from pydantic import ValidationError

from core.contracts import AdapterManifest, Sample, Skill, Turn, adapter_name, parse_adapter_name


def _turn(**kw):
    base = dict(session_id="s", turn_index=0, prompt_ids=[1, 2], response_ids=[3, 4],
                response_logprobs=[-1.0, -2.0])
    return Turn(**(base | kw))


def test_turn_requires_one_logprob_per_token():
    with pytest.raises(ValidationError, match="response_logprobs"):
        _turn(response_logprobs=[-1.0])


def test_sample_lengths_must_agree():
    with pytest.raises(ValidationError, match="len"):
        Sample(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[2, 3],
               response_logprobs=[-1, -1], reward=1, loss_mask=[1], skill_generation=0)
    with pytest.raises(ValidationError, match="0 or 1"):
        Sample(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[2],
               response_logprobs=[-1], reward=1, loss_mask=[2], skill_generation=0)


def test_sample_from_turn_keeps_tokens_and_generation():
    t = _turn(skill_generation=3, adapter_version="policy-v0002")
    s = Sample.from_turn(t, reward=1.0, trainable=True)
    assert s.response_ids == t.response_ids and s.loss_mask == [1, 1]
    assert s.skill_generation == 3 and s.adapter_version == "policy-v0002" and s.trainable
    assert not Sample.from_turn(t, reward=0.0, trainable=False).trainable


def test_unknown_fields_refused():
    with pytest.raises(ValidationError):
        _turn(colour="red")


@pytest.mark.parametrize("name", ["../etc", "A-upper", "a", "x" * 65, "has space", "-lead"])
def test_skill_names_are_slugs(name):
    with pytest.raises(ValidationError):
        Skill(name=name, description="d")


def test_adapter_names_are_versioned():
    assert adapter_name(7) == "policy-v0007" and parse_adapter_name("policy-v0007") == 7
    with pytest.raises(ValueError):
        parse_adapter_name("policy-latest")
    with pytest.raises(ValidationError):
        AdapterManifest(name="policy-v0002", version=3, base_model="b", rank=8, alpha=16,
                        target_modules=["q_proj"], step=1, skill_generation=0)
