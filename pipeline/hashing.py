"""Content identity of a stage: the code it runs and the configuration it reads.

Code digest: sha256 over the sorted source files of the static import closure (found by reading the sources,
nothing is imported) of a stage's worker module, restricted to the project's own packages. Editing `align/train/dpo_loss.py`
changes the digest of every stage whose worker can reach it through imports (DPO and what follows) and of no other.
The closure is conservative: imports inside functions and under `if TYPE_CHECKING:` count, and importing
`a.b.c` also counts `a/__init__.py` and `a/b/__init__.py`, because Python executes them. A package's C sources
(the files under a `csrc/` folder beside a module of the closure, built at run time by align/kernels/native.py)
count as that module's code too."""

from __future__ import annotations

import hashlib
import re
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


# An import statement at the start of a line (or after `;`): `import a.b as c, d` or `from .x import (y, z)`, with
# backslash continuations. A regex instead of `ast`: parsing every module of align costs ~0.3 s per doit call, and
# a no-op doit must stay under a second. It over-approximates (an import-like line inside a docstring counts too),
# which can only add files to a closure, never drop one; tests/pipeline/test_hashing.py checks it against `ast`.
_IMPORT = re.compile(
    r"(?:^|;)[ \t]*(?:from[ \t]+(?P<base>\.*[\w.]*)[ \t]+import[ \t]*(?P<names>\([^)]*\)|(?:\\\n|[^\n;])*)"
    r"|import[ \t]+(?P<mods>(?:\\\n|[^\n;])*))", re.M)
_COMMENT = re.compile(r"#[^\n]*")


def _split_names(text: str) -> list[str]:
    text = _COMMENT.sub("", text).replace("\\\n", " ").strip("() \t\n")
    return [item.split()[0] for item in text.split(",") if item.split()]


def _imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """Every module name an import statement in `source` may load (with `from x import y`, both x and x.y)."""
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for match in _IMPORT.finditer(source):
        if match.group("mods") is not None:
            names.update(_split_names(match.group("mods")))
            continue
        base = match.group("base")
        level = len(base) - len(base.lstrip("."))
        if level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (level - 1)] if level > 1 else anchor
            base = ".".join([*anchor, base[level:]] if base[level:] else anchor)
        names.add(base)
        names.update(f"{base}.{name}" for name in _split_names(match.group("names")) if name != "*")
    return names


def _signature(path: Path) -> tuple[Path, int, int]:
    st = path.stat()
    return path, st.st_mtime_ns, st.st_size


# NOTE: both caches are keyed by (path, mtime, size): stages share most of their closures, so each file is parsed
# and hashed once per process; an edited file gets a new key (an mtime-only change just costs a re-parse).
@lru_cache(maxsize=None)
def _file_imports(sig: tuple[Path, int, int], module: str) -> frozenset[str]:
    path = sig[0]
    source = path.read_text(encoding="utf-8", errors="replace")
    return frozenset(_imported_names(source, module, path.name == "__init__.py"))


@lru_cache(maxsize=None)
def _file_sha(sig: tuple[Path, int, int]) -> str:
    return sha256_bytes(sig[0].read_bytes())


def import_closure(root: Path, modules: Iterable[str], packages: Iterable[str]) -> dict[str, Path]:
    """{module: source file} for `modules` and everything they import transitively within `packages`."""
    packages = tuple(packages)
    found: dict[str, Path] = {}
    seen: set[str] = set()  # names looked up already, found or not (`from x import function` names no module)
    pending = [m for mod in modules for m in _with_parents(mod)]
    while pending:
        name = pending.pop()
        if name in seen or name.split(".")[0] not in packages:
            continue
        seen.add(name)
        path = module_file(root, name)
        if path is None:
            continue  # `from pkg import function` names no module; a missing worker is reported by the launcher
        found[name] = path
        for imported in _file_imports(_signature(path), name):
            pending.extend(_with_parents(imported))
    return found


def _with_csrc(paths: Iterable[Path]) -> set[Path]:
    """The files plus every file under a `csrc/` folder beside one of them."""
    files = set(paths)
    for folder in {p.parent / "csrc" for p in files}:
        if folder.is_dir():
            files.update(f for f in folder.rglob("*") if f.is_file())
    return files


def code_digest(root: Path, modules: Iterable[str], packages: Iterable[str] = ("align",)) -> str:
    """sha256 over (relative path, file sha256) of the sorted import closure of `modules` (with its C sources)."""
    root = Path(root).resolve()
    closure = _with_csrc(import_closure(root, set(modules), packages).values())
    files = sorted({p.relative_to(root).as_posix(): p for p in closure}.items())
    h = hashlib.sha256()
    for rel, path in files:
        h.update(f"{rel}\0{_file_sha(_signature(path))}\n".encode())
    return h.hexdigest()


def config_text(path: Path) -> str:
    """The config as the worker will see it before defaults: includes merged, keys sorted, comments and formatting
    dropped. A comment-only edit leaves it unchanged (no rerun); a value edit changes it (rerun)."""
    return toml_text(read_toml(path), sort_keys=True)
