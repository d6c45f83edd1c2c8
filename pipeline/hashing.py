"""Content identity of a stage: the code it runs and the configuration it reads.

Code digest: sha256 over the sorted source files of the static import closure (found with `ast`, nothing is
imported) of a stage's worker module, restricted to the project's own packages. Editing `align/train/dpo_loss.py`
changes the digest of every stage whose worker can reach it through imports (DPO and what follows) and of no other.
The closure is conservative: imports inside functions and under `if TYPE_CHECKING:` count, and importing
`a.b.c` also counts `a/__init__.py` and `a/b/__init__.py`, because Python executes them."""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from align.config import read_toml, toml_text
from align.utils.fsio import sha256_bytes


def module_file(root: Path, module: str) -> Path | None:
    """Source file of `module` under `root` (a package's `__init__.py`), or None when it is not project code."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module name an import statement in `tree` may load (with `from x import y`, both x and x.y)."""
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def import_closure(root: Path, modules: Iterable[str], packages: Iterable[str]) -> dict[str, Path]:
    """{module: source file} for `modules` and everything they import transitively within `packages`."""
    packages = tuple(packages)
    found: dict[str, Path] = {}
    pending = [m for mod in modules for m in _with_parents(mod)]
    while pending:
        name = pending.pop()
        if name in found or name.split(".")[0] not in packages:
            continue
        path = module_file(root, name)
        if path is None:
            continue  # `from pkg import function` names no module; a missing worker is reported by the launcher
        found[name] = path
        tree = ast.parse(path.read_bytes(), filename=str(path))
        for imported in _imported_names(tree, name, path.name == "__init__.py"):
            pending.extend(_with_parents(imported))
    return found


def code_digest(root: Path, modules: Iterable[str], packages: Iterable[str] = ("align",)) -> str:
    """sha256 over (relative path, file sha256) of the sorted import closure of `modules`."""
    return _code_digest(Path(root).resolve(), tuple(sorted(set(modules))), tuple(packages))


@lru_cache(maxsize=None)
def _code_digest(root: Path, modules: tuple[str, ...], packages: tuple[str, ...]) -> str:
    # NOTE: cached per process; doit builds its task list once per process, and files do not change under it.
    files = sorted({p.relative_to(root).as_posix(): p for p in import_closure(root, modules, packages).values()}
                   .items())
    h = hashlib.sha256()
    for rel, path in files:
        h.update(f"{rel}\0{sha256_bytes(path.read_bytes())}\n".encode())
    return h.hexdigest()


def config_text(path: Path) -> str:
    """The config as the worker will see it before defaults: includes merged, keys sorted, comments and formatting
    dropped. A comment-only edit leaves it unchanged (no rerun); a value edit changes it (rerun)."""
    return toml_text(read_toml(path), sort_keys=True)
