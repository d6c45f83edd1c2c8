"""PPO on GRPO's rollout machinery: GAE and the PPO losses as pure functions, per-token rewards, the critic,
`PpoBatchSource` (on align.rl.batch_source) and `PpoTrainModule` (on align.rl.grpo_module)."""
