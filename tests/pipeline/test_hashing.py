"""pipeline.hashing: the static import closure behind each stage's code digest, and the canonical config text."""

from pathlib import Path

import pytest

from pipeline.hashing import code_digest, config_text, import_closure
from pipeline.layout import REPO_ROOT

TREE = {
    "pkg/__init__.py": "",
    "pkg/stages/__init__.py": "",
    "pkg/stages/a.py": "import os\nimport torch\nfrom pkg.lib import helper\nfrom . import sibling\n",
    "pkg/stages/sibling.py": "from ..deep.mod import f\n",
    "pkg/stages/b.py": "def main():\n    import pkg.other.thing  # lazy imports count\n",
    "pkg/lib.py": "from pkg import util\nhelper = 1\n",
    "pkg/util.py": "",
    "pkg/deep/__init__.py": "from .mod import f\n",
    "pkg/deep/mod.py": "def f(): pass\n",
    "pkg/other/__init__.py": "",
    "pkg/other/thing.py": "",
    "pkg/unused.py": "",
}


@pytest.fixture
def tree(tmp_path):
    for rel, text in TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_closure_follows_absolute_relative_and_lazy_imports(tree):
    a = set(import_closure(tree, ["pkg.stages.a"], ["pkg"]))
    assert a == {"pkg", "pkg.stages", "pkg.stages.a", "pkg.lib", "pkg.util", "pkg.stages.sibling", "pkg.deep",
                 "pkg.deep.mod"}
    b = set(import_closure(tree, ["pkg.stages.b"], ["pkg"]))
    assert b == {"pkg", "pkg.stages", "pkg.stages.b", "pkg.other", "pkg.other.thing"}


def test_digest_changes_only_with_the_closure(tree):
    da, db = code_digest(tree, ["pkg.stages.a"], ["pkg"]), code_digest(tree, ["pkg.stages.b"], ["pkg"])
    (tree / "pkg/unused.py").write_text("x = 1\n")
    (tree / "pkg/deep/mod.py").write_text("def f(): return 2\n")
    import pipeline.hashing as H

    H._code_digest.cache_clear()
    assert code_digest(tree, ["pkg.stages.a"], ["pkg"]) != da
    assert code_digest(tree, ["pkg.stages.b"], ["pkg"]) == db


def test_real_tree_keeps_dpo_code_out_of_sft():
    root = REPO_ROOT
    if not (root / "align/train/sft_module.py").is_file() or not (root / "align/train/dpo_loss.py").is_file():
        pytest.skip("SFT and DPO modules not present yet")
    sft = import_closure(root, ["align.train.sft_module"], ["align"])
    assert "align.train.dpo_loss" not in sft and "align.train.sft_loss" in sft


def test_config_text_ignores_comments_and_order_but_not_values(tmp_path):
    (tmp_path / "base.toml").write_text("[a]\nx = 1\n")
    one = tmp_path / "one.toml"
    one.write_text("include = 'base.toml'\n# comment\n[b]\nz = 2\ny = 'q'\n")
    two = tmp_path / "two.toml"
    two.write_text("[b]\ny = \"q\"\nz = 2\n[a]\nx = 1\n")
    assert config_text(one) == config_text(two)
    two.write_text("[b]\ny = \"q\"\nz = 3\n[a]\nx = 1\n")
    assert config_text(one) != config_text(two)
