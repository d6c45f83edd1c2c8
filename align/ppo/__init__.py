"""PPO pieces (issue 21): LoRA adapters (usable by every stage), GAE and the PPO losses as pure functions."""
