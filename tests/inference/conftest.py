"""tests/inference: helpers sit beside the tests (and tests/model's transformers twin is reused by the oracle
tier); torch on one thread (two cores are shared)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "model"))
torch.set_num_threads(1)
