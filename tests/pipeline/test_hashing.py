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
    assert code_digest(tree, ["pkg.stages.a"], ["pkg"]) != da
    assert code_digest(tree, ["pkg.stages.b"], ["pkg"]) == db


def test_c_sources_beside_a_module_count_as_its_code(tree):
    (tree / "pkg/deep/csrc").mkdir()
    kernel = tree / "pkg/deep/csrc/kernel.c"
    kernel.write_text("int f(void) { return 1; }\n")
    a, b = code_digest(tree, ["pkg.stages.a"], ["pkg"]), code_digest(tree, ["pkg.stages.b"], ["pkg"])
    kernel.write_text("int f(void) { return 2; }\n")
    assert code_digest(tree, ["pkg.stages.a"], ["pkg"]) != a  # a imports pkg.deep.mod, beside csrc/
    assert code_digest(tree, ["pkg.stages.b"], ["pkg"]) == b  # b never reaches pkg.deep


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


def _ast_imports(path: Path, module: str) -> set[str]:
    """The oracle: what Python's own parser says each import statement of a file names."""
    import ast

    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)] if node.level else []
            base = ".".join([*anchor, node.module] if node.module else anchor)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return names


def test_import_scanner_never_misses_what_ast_finds():
    """The regex scanner may over-approximate (import-like docstring lines) but must find every real import of
    every Python file in the repository, and of tricky forms."""
    from pipeline.hashing import _imported_names

    tricky = ("from a.b import (c,  # comment\n    d as e,\n)\nimport f.g as h, i\nx = 1; import j\n"
              "from . import k\nfrom .. import l\nfrom .m import n, \\\n    o\nif x:\n    from p import q\n")
    files = [(Path("pkg/sub/mod.py"), "pkg.sub.mod", tricky)]
    for path in sorted(REPO_ROOT.glob("*/**/*.py")):
        rel = path.relative_to(REPO_ROOT)
        if rel.parts[0] in ("align", "pipeline", "tests", "bench"):
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            files.append((path, module, None))
    for path, module, text in files:
        source = text if text is not None else path.read_text()
        is_pkg = path.name == "__init__.py"
        found = _imported_names(source, module, is_pkg)
        if text is not None:
            assert found == {"a.b", "a.b.c", "a.b.d", "f.g", "i", "j", "pkg.sub", "pkg.sub.k", "pkg", "pkg.l",
                             "pkg.sub.m", "pkg.sub.m.n", "pkg.sub.m.o", "p", "p.q"}
            continue
        missing = _ast_imports(path, module) - found
        assert not missing, f"{path}: scanner missed {sorted(missing)}"
