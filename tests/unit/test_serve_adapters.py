import pytest

from serve.adapters import AdapterRegistry


def reg():
    r = AdapterRegistry(base_name="base", alias="policy", retention=2)
    for v in (1, 2, 3):
        r.add(f"policy-v000{v}", f"/a/{v}")
    return r


def test_resolution_pins_base_version_or_active():
    r = reg()
    assert r.resolve("policy") is None  # nothing active yet -> base
    r.activate("policy-v0002")
    assert r.resolve("policy") == "policy-v0002"
    assert r.resolve("gpt-4o") == "policy-v0002"  # unknown ids mean "the policy"
    assert r.resolve("base") is None
    assert r.resolve("policy-v0001") == "policy-v0001"


def test_inflight_request_keeps_its_version_until_done():
    r = reg()
    r.activate("policy-v0001")
    pinned = r.resolve("policy")
    r.begin(pinned)
    r.activate("policy-v0002")
    assert r.retire("policy-v0001") == []  # still in use: not removable yet
    assert r.resolve("policy-v0001") == "policy-v0002"  # retiring versions are not handed out
    assert r.end(pinned) == ["policy-v0001"]  # last request done -> now removable


def test_active_cannot_be_retired_and_unknown_cannot_activate():
    r = reg()
    r.activate("policy-v0003")
    with pytest.raises(ValueError):
        r.retire("policy-v0003")
    with pytest.raises(KeyError):
        r.activate("policy-v0009")


def test_retention_keeps_newest_and_active():
    r = reg()
    r.activate("policy-v0003")
    assert r.over_retention() == ["policy-v0001"]


def test_only_versioned_names():
    with pytest.raises(ValueError):
        reg().add("latest", "/x")


def test_a_model_id_that_is_not_a_string_means_the_policy():
    """The engine's own guard (the Proxy refuses such a body with a 400 first): an unhashable `model` from a
    caller of the engine's handle must not raise."""
    reg = AdapterRegistry(base_name="base", alias="policy")
    reg.loaded["policy-v0001"] = "/a"
    reg.active = "policy-v0001"
    assert reg.resolve([]) == reg.resolve({"x": 1}) == reg.resolve(7) == "policy-v0001"
