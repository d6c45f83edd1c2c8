"""Tokenizer throughput: tokens/s of align.tokenizer on 1 MB of mixed English + code text, single thread, side by
side with `tokenizers` (the Rust reference) when it is installed. Prints one JSON line.

The text is built offline and deterministically from this Python's standard library: English = docstrings of the
stdlib modules (ast.get_docstring), code = the stdlib .py sources, interleaved in 4 KiB blocks, 1 MiB of UTF-8.

    python bench/tokenizer_throughput.py [--mib 1.0] [--repeat 3]

Figures: `cold` = a fresh Tokenizer (empty word cache) encoding the text once, as a data stage's first pass does;
`warm` = encoding it again (every word cached); `per_doc` = the same text as 4 KiB documents, one encode call
each, warm. Best of --repeat runs. The single-thread reference is `tokenizers` with RAYON_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers is imported: one thread
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from align.tokenizer import BpeCacheConfig, Tokenizer  # noqa: E402
from align.tokenizer.tokenizer import VENDORED_DIR  # noqa: E402

BLOCK = 4096


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py"))


def _docstrings(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    return [d for n in nodes if (d := ast.get_docstring(n))]


def mixed_text(n_bytes: int) -> str:
    english: list[str] = []
    code: list[str] = []
    for path in _stdlib_files():
        source = path.read_text(encoding="utf-8", errors="replace")
        english.extend(_docstrings(source))
        code.append(source)
    prose, program = "\n\n".join(english), "\n".join(code)
    out, size, i = [], 0, 0
    while size < n_bytes:
        block = (prose if (i // BLOCK) % 2 == 0 else program)[i // 2: i // 2 + BLOCK]
        out.append(block)
        size += len(block.encode("utf-8"))
        i += BLOCK
    text = "".join(out)
    return text.encode("utf-8")[:n_bytes].decode("utf-8", errors="ignore")


def _best(fn, repeat: int) -> tuple[float, float]:
    """Best (wall seconds, CPU seconds of this process) over `repeat` runs. CPU time is the figure to trust on a
    shared machine: other processes stretch wall time, not this thread's CPU time."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
    return wall, cpu


def _rates(prefix: str, n: int, times: tuple[float, float]) -> dict:
    return {f"{prefix}_tok_s": round(n / times[0]), f"{prefix}_tok_per_cpu_s": round(n / times[1])}


def _cache_bytes(tok: Tokenizer) -> int:
    """Keys + tuples + the ints they hold (small ints are shared, so this over-counts a little)."""
    cache = tok._bpe._cache  # the one private peek: the bench reports the cache's real footprint
    return sum(sys.getsizeof(k) + sys.getsizeof(v) + 28 * len(v) for k, v in cache.items()) + sys.getsizeof(cache)


def _cold(text: str, repeat: int) -> tuple[float, float]:
    """Encode on a freshly loaded Tokenizer (empty word cache); the load itself is not timed."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        fresh = Tokenizer.from_pretrained()
        best = tuple(map(min, best, _best(lambda: fresh.encode(text), 1)))
    return best


def _reference(text: str, docs: list[str], ids: list[int], repeat: int) -> dict:
    try:
        import tokenizers
    except ImportError:
        return {"reference": "tokenizers not installed"}
    hf = tokenizers.Tokenizer.from_file(str(VENDORED_DIR / "tokenizer.json"))
    hf.encode_special_tokens = True  # plain-text mode, as ours
    whole = _best(lambda: hf.encode(text, add_special_tokens=False), repeat)
    per_doc = _best(lambda: [hf.encode(d, add_special_tokens=False) for d in docs], repeat)
    n = len(ids)
    return {"tokenizers_version": tokenizers.__version__, **_rates("tokenizers", n, whole),
            **_rates("tokenizers_per_doc", n, per_doc),
            "ids_identical": hf.encode(text, add_special_tokens=False).ids == ids, "_cpu": (whole[1], per_doc[1])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    text = mixed_text(int(args.mib * 1024 * 1024))
    docs = [text[i:i + BLOCK] for i in range(0, len(text), BLOCK)]
    start = time.perf_counter()
    tok = Tokenizer.from_pretrained()
    load_s = time.perf_counter() - start
    cold = _cold(text, args.repeat)
    ids = tok.encode(text)
    n = len(ids)
    warm = _best(lambda: tok.encode(text), args.repeat)
    per_doc = _best(lambda: [tok.encode(d) for d in docs], args.repeat)
    result = {
        "bench": "tokenizer_throughput", "text_bytes": len(text.encode("utf-8")), "tokens": n,
        "python": sys.version.split()[0], "threads": 1, "load_s": round(load_s, 3),
        **_rates("ours_cold", n, cold), **_rates("ours_warm", n, warm), **_rates("ours_per_doc", n, per_doc),
        "cache_entries": tok.cache_size(), "cache_max_entries": BpeCacheConfig().max_entries,
        "cache_mib_approx": round(_cache_bytes(tok) / 2**20, 1),
    }
    ref = _reference(text, docs, ids, args.repeat)
    ref_cpu = ref.pop("_cpu", None)
    result.update(ref)
    if ref_cpu is not None:  # > 1: ours is faster, by CPU time
        result["cpu_ratio_ours_cold_vs_tokenizers"] = round(ref_cpu[0] / cold[1], 3)
        result["cpu_ratio_ours_per_doc_vs_tokenizers_per_doc"] = round(ref_cpu[1] / per_doc[1], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
