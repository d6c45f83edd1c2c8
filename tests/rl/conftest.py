"""tests/rl: fixtures sit beside the tests; torch on one thread (two cores are shared)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)
