"""LoRA adapters, usable by every training stage (SFT, DPO, GRPO, PPO): the adapter modules (`adapters`), their step
checkpoints and PEFT export (`checkpoint`), the engine's unmerged adapter path in the decode step (`decode`) and the
stages' shared wiring (`stage`). Each file sits at the layer of what it imports (docs/ARCHITECTURE.md, "Layers")."""
