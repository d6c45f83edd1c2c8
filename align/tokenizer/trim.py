"""Vocabulary trimming: a tokenizer.json that keeps the pieces a corpus uses, renumbered densely.

Why: a tiny model's compute is dominated by its head (32,768 x hidden for Mistral v0.3), while the bundled task
uses 130 of those pieces. A model over the trimmed vocabulary spends its FLOPs on the trunk, and the tokenizer it
runs is still the real one on the corpus: the same pieces, in the same order, only with other ids.

What is kept, in the base tokenizer's id order (so `<unk>`, `<s>`, `</s>`, `[INST]`, ... keep their ids):
- the named added tokens (the chat template's controls; the other specials are dropped);
- every `<0xXX>` byte piece and the unknown token, so any text still encodes (a piece that was dropped falls back
  to smaller kept pieces, down to bytes) and decodes to itself;
- every symbol the base BPE builds while encoding the corpus: each word's initial symbols and every merge result on
  the way to its final pieces (the closure);
- a merge only when both parts and the result are kept.

Exactness on the corpus: the trimmed merge table is a subset of the base one that holds every merge the base applied
to a corpus word, so at each step the lowest-rank applicable merge is the same one, and the pieces come out the same
(`check_trim` proves it on every text before anything is written). Other text may come out in more, smaller pieces
than the base would give, and still decodes to itself.

    python -m align.tokenizer.trim --corpus data/raw/*.parquet data/corpus/*.parquet --out <dir>

writes a tokenizer directory (tokenizer.json, tokenizer_config.json, special_tokens_map.json, TRIM.json with the
base's and the corpus files' hashes) that `Tokenizer.from_pretrained` and transformers load. A model over it needs
`vocab_size` = the trimmed size (TRIM.json `vocab_size`).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from align.exceptions import ArtifactError
from align.tokenizer.tokenizer import MISTRAL_V03, Tokenizer, resolve_tokenizer_dir
from align.utils.fsio import atomic_write_bytes, publish_dir, sha256_file, staging_dir

# The added tokens Mistral's chat and tool-call templates write; [control_N], [IMG], [REFERENCE_DOC_N] are dropped.
CHAT_CONTROLS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                 "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")


@dataclass(frozen=True)
class TrimResult:
    spec: dict  # the trimmed tokenizer.json
    new_id: dict[int, int]  # base id -> trimmed id, for every kept piece
    corpus_pieces: int  # distinct final pieces of the corpus


def corpus_closure(tok: Tokenizer, texts: Iterable[str]) -> tuple[set[int], set[int]]:
    """(every symbol the base BPE builds on `texts`, the final pieces) for plain text (no specials parsed)."""
    built: set[int] = set()
    finals: set[int] = set()
    done: set[str] = set()
    for text in texts:
        for word in tok.pre_tokenize(text):
            if word not in done:
                done.add(word)
                finals.update(tok.bpe.trace(word, built))
    return built, finals


def trim_spec(base_spec: dict, base: Tokenizer, texts: Iterable[str],
              controls: tuple[str, ...] = CHAT_CONTROLS) -> TrimResult:
    """The trimmed tokenizer.json of `base` (built from `base_spec`) for the corpus `texts`."""
    model = base_spec["model"]
    vocab: dict[str, int] = model["vocab"]
    missing = [c for c in controls if base.token_to_id(c) is None]
    if missing:
        raise ArtifactError(f"{base.source}: the controls {missing} are not tokens of this vocabulary")
    built, finals = corpus_closure(base, texts)
    keep = set(built) | {base.token_to_id(c) for c in controls}
    keep |= {vocab[f"<0x{b:02X}>"] for b in range(256) if f"<0x{b:02X}>" in vocab}
    if model.get("unk_token") is not None:
        keep.add(vocab[model["unk_token"]])
    new_id = {old: new for new, old in enumerate(sorted(keep))}
    spec = copy.deepcopy(base_spec)
    spec["model"]["vocab"] = {t: new_id[i] for t, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i in new_id}
    kept_tokens = spec["model"]["vocab"]
    spec["model"]["merges"] = [m for m in _merge_pairs(model.get("merges", []))
                               if m[0] in kept_tokens and m[1] in kept_tokens and m[0] + m[1] in kept_tokens]
    spec["added_tokens"] = [dict(t, id=new_id[t["id"]]) for t in base_spec.get("added_tokens", [])
                            if t["content"] in controls]
    _renumber_post_processor(spec.get("post_processor"), new_id)
    return TrimResult(spec=spec, new_id=new_id, corpus_pieces=len(finals))


def trimmed_tokenizer_config(base_config: dict, result: TrimResult) -> dict:
    """tokenizer_config.json for the trimmed vocabulary: `added_tokens_decoder` holds the trimmed spec's added
    tokens under their new ids."""
    config = copy.deepcopy(base_config)
    decoder = base_config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        kept = {t["content"] for t in result.spec["added_tokens"]}
        config["added_tokens_decoder"] = {str(result.new_id[int(k)]): v for k, v in decoder.items()
                                          if v.get("content") in kept}
    return config


def check_trim(base: Tokenizer, trimmed: Tokenizer, new_id: dict[int, int], texts: Iterable[str]) -> int:
    """Every text encodes to the base pieces renumbered, and decodes back; returns how many texts were checked."""
    n = 0
    for n, text in enumerate(texts, 1):
        base_ids = base.encode(text)
        got = trimmed.encode(text)
        if got != [new_id[i] for i in base_ids]:
            raise ArtifactError(f"trimmed tokenizer differs from {base.source} on text {n}: {text[:80]!r}")
        if trimmed.decode(got) != base.decode(base_ids):
            raise ArtifactError(f"trimmed tokenizer decodes text {n} differently: {text[:80]!r}")
    return n


def _merge_pairs(raw: list) -> list[list[str]]:
    return [item.split(" ") if isinstance(item, str) else list(item) for item in raw]


def _renumber_post_processor(proc: dict | None, new_id: dict[int, int]) -> None:
    """In place (on the spec's copy): TemplateProcessing's special_tokens carry ids; a Sequence holds processors."""
    if not isinstance(proc, dict):
        return
    for sub in proc.get("processors") or []:
        _renumber_post_processor(sub, new_id)
    for entry in (proc.get("special_tokens") or {}).values():
        entry["ids"] = [new_id[i] for i in entry.get("ids", [])]


def dumps(spec: dict) -> bytes:
    """The tokenizer.json bytes: key order as built, no ASCII escaping (the pieces are UTF-8), newline-terminated."""
    return (json.dumps(spec, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


# ---- the corpus and the command line ---------------------------------------------------------------------------

SKIP_COLUMNS = ("id", "key", "error_kind")  # identifiers, never encoded by a stage


def parquet_texts(paths: Iterable[Path], skip: tuple[str, ...] = SKIP_COLUMNS) -> Iterator[str]:
    """Every string of every row (nested lists and structs included, e.g. chat `messages`), each as itself and as
    the chat template encodes a message (" " + the text, and " " + the stripped text)."""
    import pyarrow.parquet as pq

    for path in paths:
        for row in pq.read_table(path).to_pylist():
            for column, value in row.items():
                if column in skip:
                    continue
                for text in _strings(value):
                    yield from dict.fromkeys((text, " " + text, " " + text.strip()))


def _strings(value) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def write_trimmed(base_name: str, corpus: list[Path], out: Path) -> dict:
    """Trim, prove the trim on every corpus text with the files as written, and publish the directory at `out`."""
    base_dir = resolve_tokenizer_dir(base_name)
    base = Tokenizer.from_pretrained(base_dir)
    texts = list(parquet_texts(corpus))
    if not texts:
        raise ArtifactError(f"{[str(p) for p in corpus]}: no text to trim on")
    result = trim_spec(json.loads((base_dir / "tokenizer.json").read_bytes()), base, texts)
    stage = staging_dir(out)
    try:
        _write_directory(stage, base_dir, result)
        trimmed = Tokenizer.from_pretrained(stage)  # what a stage will load: bos/eos from the copied configs
        checked = check_trim(base, trimmed, result.new_id, texts)
        record = {"base": base_name, "base_tokenizer_sha256": sha256_file(base_dir / "tokenizer.json"),
                  "corpus": {str(p): sha256_file(p) for p in corpus}, "texts_checked": checked,
                  "vocab_size": trimmed.vocab_size, "base_vocab_size": base.vocab_size,
                  "corpus_pieces": result.corpus_pieces, "merges": len(result.spec["model"]["merges"])}
        atomic_write_bytes(stage / "TRIM.json", (json.dumps(record, indent=2) + "\n").encode())
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    publish_dir(stage, out)
    return record


def _write_directory(stage: Path, base_dir: Path, result: TrimResult) -> None:
    atomic_write_bytes(stage / "tokenizer.json", dumps(result.spec))
    config_path = base_dir / "tokenizer_config.json"
    if config_path.is_file():
        config = trimmed_tokenizer_config(json.loads(config_path.read_text(encoding="utf-8")), result)
        atomic_write_bytes(stage / "tokenizer_config.json", (json.dumps(config, indent=2) + "\n").encode())
    for name in ("special_tokens_map.json", "chat_template.jinja"):
        if (base_dir / name).is_file():
            shutil.copyfile(base_dir / name, stage / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Trim a tokenizer's vocabulary to the pieces a parquet corpus uses.")
    ap.add_argument("--base", default=MISTRAL_V03, help="a tokenizer directory, or the vendored mistral-7b-v0.3")
    ap.add_argument("--corpus", type=Path, nargs="+", required=True, help="parquet files whose strings are encoded")
    ap.add_argument("--out", type=Path, required=True, help="the trimmed tokenizer directory to (re)write")
    args = ap.parse_args(argv)
    try:
        record = write_trimmed(args.base, args.corpus, args.out)
    except (ArtifactError, OSError) as exc:
        print(f"align.tokenizer.trim: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
