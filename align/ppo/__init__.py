"""PPO (issue 21): GAE and the PPO losses as pure functions, per-token rewards, the critic, `PpoBatchSource` and
`PpoTrainModule` (align.ppo.module), and LoRA adapters (usable by every stage)."""
