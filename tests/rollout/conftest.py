"""tests/rollout: reuses tests/inference's builders; torch on one thread (two cores are shared)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "inference"))
torch.set_num_threads(1)
