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

from align.tokenizer import Tokenizer  # noqa: E402
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


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


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
    cold_s = float("inf")
    for _ in range(args.repeat):
        fresh = Tokenizer.from_pretrained()
        start = time.perf_counter()
        ids = fresh.encode(text)
        cold_s = min(cold_s, time.perf_counter() - start)
    tok.encode(text)
    warm_s = _best(lambda: tok.encode(text), args.repeat)
    per_doc_s = _best(lambda: [tok.encode(d) for d in docs], args.repeat)
    n = len(ids)
    result = {
        "bench": "tokenizer_throughput", "text_bytes": len(text.encode("utf-8")), "tokens": n,
        "python": sys.version.split()[0], "threads": 1, "load_s": round(load_s, 3),
        "ours_cold_tok_s": round(n / cold_s), "ours_warm_tok_s": round(n / warm_s),
        "ours_per_doc_tok_s": round(n / per_doc_s), "cache_entries": tok.cache_size(),
        "cache_max_entries": 65536,
    }
    try:
        import tokenizers
    except ImportError:
        result["reference"] = "tokenizers not installed"
    else:
        hf = tokenizers.Tokenizer.from_file(str(VENDORED_DIR / "tokenizer.json"))
        hf.encode_special_tokens = True  # plain-text mode, as ours above
        ref_ids = hf.encode(text, add_special_tokens=False).ids
        ref_s = _best(lambda: hf.encode(text, add_special_tokens=False), args.repeat)
        ref_doc_s = _best(lambda: [hf.encode(d, add_special_tokens=False) for d in docs], args.repeat)
        result.update({
            "tokenizers_version": tokenizers.__version__, "tokenizers_tok_s": round(n / ref_s),
            "tokenizers_per_doc_tok_s": round(n / ref_doc_s), "ids_identical": ref_ids == ids,
            "ratio_cold": round(ref_s / cold_s, 3), "ratio_warm": round(ref_s / warm_s, 3),
            "ratio_per_doc": round(ref_doc_s / per_doc_s, 3),
        })
    print(json.dumps(result))


if __name__ == "__main__":
    main()
