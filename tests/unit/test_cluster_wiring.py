"""What the composition root hands the planes by name (cluster/system.py)."""

from core.config import load_config


def test_the_gate_replays_under_the_adapter_users_are_served():
    """The validation gate must replay tasks with what users get: the policy alias resolves to the active
    adapter (serve/adapters.py), the base model's served name to the base without any adapter."""
    from cluster.system import collective_wiring
    from core.storage import StorageLayout

    cfg = load_config(None)
    wiring = collective_wiring(cfg, StorageLayout(cfg.storage_path()))
    assert wiring["gate"]["engine"]["model"] == cfg.model.policy_alias


def test_the_engine_judge_is_the_base_model():
    from cluster.system import engine_judge

    cfg = load_config(None)
    cfg.rewards.checkers = []
    cfg.rewards.judge = None
    cfg.rewards.judge_source = "engine"
    assert engine_judge(cfg)["model"] == cfg.model.served_name
