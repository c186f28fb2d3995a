"""LocalSampleSink: durable, idempotent per sample id, readable from another connection."""

from core.contracts import Sample, Turn
from rewards.sinks import LocalSampleSink, SampleSink


def sample(i, sid="s"):
    t = Turn(session_id=sid, turn_index=i, prompt_ids=[1], response_ids=[2, 3], response_logprobs=[-1.0, -1.5])
    return Sample.from_turn(t, 1.0, True, sample_id=t.turn_id, reward_source="judge")


async def test_append_is_durable_and_ignores_duplicates(tmp_path):
    path = tmp_path / "replay" / "samples.sqlite"
    sink = LocalSampleSink(path)
    assert isinstance(sink, SampleSink)
    a, b = sample(0), sample(1)
    assert await sink.append([a, b]) == 2
    assert await sink.append([a]) == 0  # a re-delivered turn is stored once
    sink.close()
    reopened = LocalSampleSink(path)
    assert [s.sample_id for s in reopened.samples("s")] == [a.sample_id, b.sample_id]
    assert reopened.samples("s")[0] == a and reopened.count() == 2
