"""tests/eval: the fixtures module sits beside the tests; keep torch to one thread (two cores are shared)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)
