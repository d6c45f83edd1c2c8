"""tests/kernels: torch on one thread (two cores are shared)."""

import torch

torch.set_num_threads(1)
