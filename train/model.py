"""Policy model and optimizer backends for the GRPO workers: base model + peft LoRA, DDP or DeepSpeed.

- DDP (default): `ray.train.torch.prepare_model` wraps the peft model (gloo on CPU, NCCL on GPU), AdamW
  over the LoRA parameters, optional bf16 autocast (base weights loaded in bf16, LoRA weights kept fp32
  by peft, so the optimizer state stays fp32).
- DeepSpeed ZeRO-2 (`train.deepspeed_zero2`, meant for GPU): `deepspeed.initialize` on the process group
  Ray Train already set up; optimizer state and gradients are partitioned across workers; bf16 through
  DeepSpeed's own bf16 mode. Uses a plain torch AdamW (`zero_force_ds_cpu_optimizer: false`) so the
  same code also runs on DeepSpeed's CPU accelerator (CPU-RECIPES.md). Checkpoints are DeepSpeed's own
  sharded format, written by every worker into the Ray Train checkpoint.
  NOTE: ZeRO shards are per world size; an elastic run that resumes on a different number of workers
  must use DDP (its checkpoint is world-size free) or convert with DeepSpeed's universal checkpoints.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

import torch

from core.config import TrainConfig

OPTIMIZER_FILE = "optimizer.pt"
DS_DIR = "deepspeed"


def skip_sklearn() -> None:
    """Keep scikit-learn out of this process's transformers: transformers imports it (with scipy.stats, ~1 s
    on this 2-core machine) as soon as its generation utilities load, i.e. with any model class, only for
    assisted decoding's confidence threshold (`transformers.generation.candidate_generator`), which a
    trainer never runs. A training worker is a fresh process every window, so that second was part of every
    window's fixed cost (benchmarks/window_efficiency.py). transformers has no switch for it, so its own
    availability check answers "no" (assisted decoding then runs without the threshold, as it does where
    scikit-learn is not installed). Must run before transformers' generation module is first imported."""
    if "transformers.generation.candidate_generator" in sys.modules:
        return  # too late in this process (it was imported before): nothing to gain
    import transformers.utils

    transformers.utils.is_sklearn_available = lambda: False


def build_peft_model(model_path: str, cfg: TrainConfig, device: torch.device) -> torch.nn.Module:
    """Base causal LM from a local folder + a fresh LoRA adapter (rank/alpha/targets from cfg.lora)."""
    skip_sklearn()
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if cfg.bf16 else torch.float32
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    base.config.use_cache = False
    torch.manual_seed(cfg.seed)  # identical LoRA init on every worker (DDP also broadcasts rank 0's)
    lora = LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, lora).to(device)


def load_adapter_weights(peft_model: torch.nn.Module, adapter_dir: Path) -> None:
    """Load LoRA weights saved by `save_pretrained` into the (unwrapped) peft model."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    weights = load_peft_weights(str(adapter_dir), device=str(next(peft_model.parameters()).device))
    result = set_peft_model_state_dict(peft_model, weights)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"checkpoint adapter has keys this model lacks: {unexpected[:5]}")


class DDPBackend:
    """AdamW over LoRA params of a (possibly DDP-wrapped) model. See train.step.Backend."""

    fixed_micro_batches = False  # any number per step: micro-batches follow `train.micro_batch_tokens`

    def __init__(self, peft_model: torch.nn.Module, cfg: TrainConfig, device: torch.device, world: int) -> None:
        import ray.train.torch

        self.peft_model = peft_model
        # prepare_model moves to the device and wraps in DDP when world > 1.
        self.model = ray.train.torch.prepare_model(peft_model) if world > 1 else peft_model
        params = [p for p in peft_model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr)
        self._params, self._max_norm = params, cfg.max_grad_norm
        self._autocast = torch.bfloat16 if cfg.bf16 else None
        self._device_type = device.type

    def autocast(self) -> contextlib.AbstractContextManager:
        if self._autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self._device_type, dtype=self._autocast)

    def no_sync(self, last_micro: bool) -> contextlib.AbstractContextManager:
        # DDP all-reduces on every backward unless told not to: only the last micro-batch syncs.
        if last_micro or not hasattr(self.model, "no_sync"):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self._params, self._max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def discard(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def save(self, ckpt_dir: Path, rank: int) -> bool:
        """Rank 0 writes adapter + optimizer (DDP replicas are identical). Returns whether it wrote."""
        if rank != 0:
            return False
        self.peft_model.save_pretrained(str(ckpt_dir / "adapter"))
        torch.save(self.optimizer.state_dict(), ckpt_dir / OPTIMIZER_FILE)
        return True

    def load(self, ckpt_dir: Path) -> None:
        load_adapter_weights(self.peft_model, ckpt_dir / "adapter")
        state = torch.load(ckpt_dir / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(state)


def deepspeed_config(cfg: TrainConfig, world: int) -> dict:
    """ZeRO-2 config. DeepSpeed insists batch sizes add up; we feed micro-batches ourselves, so the
    numbers only need to be consistent (train_batch = micro * grad_accum * world)."""
    micro = max(1, math.ceil(cfg.batch_size / (world * cfg.grad_accum)))
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": micro * cfg.grad_accum * world,
        "gradient_clipping": cfg.max_grad_norm,
        "bf16": {"enabled": cfg.bf16},
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


class DeepSpeedBackend:
    """A DeepSpeed ZeRO-2 engine around the peft model. See train.step.Backend."""

    fixed_micro_batches = True  # gradient_accumulation_steps = grad_accum: its boundary is every that many

    def __init__(self, peft_model: torch.nn.Module, cfg: TrainConfig, device: torch.device, world: int) -> None:
        import deepspeed  # optional dependency (pyproject extra "gpu")

        self.peft_model = peft_model
        params = [p for p in peft_model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.lr)
        # Ray Train has already initialised torch.distributed; DeepSpeed reuses that process group.
        self.model, self.optimizer, _, _ = deepspeed.initialize(
            model=peft_model, optimizer=optimizer, config=deepspeed_config(cfg, world)
        )
        self._grad_accum = cfg.grad_accum

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # DeepSpeed's bf16 mode casts the module itself

    def no_sync(self, last_micro: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # ZeRO-2 reduces at the accumulation boundary itself

    def backward(self, loss: torch.Tensor) -> None:
        # Our micro losses already sum to the step's mean: stop DeepSpeed dividing by grad_accum again.
        self.model.backward(loss, scale_wrt_gas=False)
        if not self.model.is_gradient_accumulation_boundary():
            self.model.step()  # counts the micro-batch; the boundary's update waits for step()/discard()

    def step(self) -> float:
        self.model.step()  # at the accumulation boundary: the optimizer update
        norm = self.model.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def discard(self) -> None:
        # A refused step: clear ZeRO's reduced gradients and count the boundary micro-batch as
        # `engine.step()` would, without the update. NOTE: not exercised on CPU (no DeepSpeed here).
        self.model.optimizer.zero_grad()
        self.model.micro_steps += 1

    def save(self, ckpt_dir: Path, rank: int) -> bool:
        """Every rank writes its ZeRO shard (collective); rank 0 also writes the peft adapter."""
        self.model.save_checkpoint(str(ckpt_dir / DS_DIR), tag="step")
        if rank == 0:
            self.peft_model.save_pretrained(str(ckpt_dir / "adapter"))
        return True

    def load(self, ckpt_dir: Path) -> None:
        self.model.load_checkpoint(str(ckpt_dir / DS_DIR), tag="step")


def make_backend(peft_model: torch.nn.Module, cfg: TrainConfig, device: torch.device, world: int):
    cls = DeepSpeedBackend if cfg.deepspeed_zero2 else DDPBackend
    return cls(peft_model, cfg, device, world)
