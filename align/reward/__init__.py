"""Reward models: the Bradley-Terry outcome reward model (`rm_loss`, `rm_module`, whose `critic_from_policy` also
starts PPO's critic) and the process reward model (`rm_process`) with its rule-labelled step data (`step_labels`,
`step_batches`)."""
