"""tests/ppo: the model tests' tiny builders are shared; torch on one thread (two cores are shared)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "model"))
torch.set_num_threads(1)
