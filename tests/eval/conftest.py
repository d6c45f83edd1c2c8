"""tests/eval: the fixtures module sits beside the tests; keep torch to one thread (two cores are shared)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from golden_eval_project import build_eval_project  # noqa: E402  (beside the tests: importable from here on)


@pytest.fixture(scope="module")
def eval_project(tmp_path_factory) -> Path:
    """The golden_eval worker's small project (golden_eval_project.build_eval_project), one per test module: a
    module may replace its checkpoint or write anchors."""
    return build_eval_project(tmp_path_factory.mktemp("proj"))
