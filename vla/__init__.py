"""Vision-Language-Action models (a later issue; torch): a compact flow-matching VLA,
demonstrations,
SFT and RL post-training in simulation, adapters for π0/lerobot checkpoints on local disk."""
