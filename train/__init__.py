"""The slow loop: durable generation-filtered replay, GRPO on Ray Train, adapter publishing."""
