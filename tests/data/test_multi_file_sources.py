"""A source of several files (a glob of local shards, or `urls` of a dataset's parquet shards over HTTP) ingests to
exactly the records of the same rows in one file, each file's sha256 in the manifest; pretraining corpora read the
same way."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.hub import HttpConfig
from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.pretrain_corpus import CorpusConfig, CorpusSourceConfig, build_corpus
from align.data.synthetic_corpus import documents
from align.exceptions import DataError
from align.tokenizer import Tokenizer
from align.utils.fsio import sha256_file
from tests.data.loopback_http import LoopbackServer

FAST = HttpConfig(timeout_s=5.0, retries=1, backoff_s=0.01)


def _rows(n: int) -> list[dict]:
    return [{"id": f"r{i}", "prompt": f"What is {i} times 3?", "answer": str(3 * i)} for i in range(n)]


def _shards(tmp_path, rows: list[dict], cuts: list[int]) -> list[str]:
    """rows written as parquet shards data/train-0000k.parquet split at `cuts`; names relative to tmp_path."""
    (tmp_path / "data").mkdir(exist_ok=True)
    bounds, names = [0, *cuts, len(rows)], []
    for k, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        names.append(f"data/train-{k:05d}.parquet")
        pq.write_table(pa.Table.from_pylist(rows[lo:hi]), tmp_path / names[-1])
    return names


SRC = dict(kind="prompts", format="prompt_answer", id_column="id", batch_rows=16)


def test_a_glob_ingests_the_records_of_one_file_and_hashes_each(tmp_path):
    rows = _rows(100) + _rows(3)  # three duplicates across the last shard: de-duplicated across files
    names = _shards(tmp_path, rows, [30, 64])
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "whole.parquet")
    many = ingest_source("m", SourceConfig(path="data/train-*.parquet", **SRC), tmp_path / "many", tmp_path)
    one = ingest_source("m", SourceConfig(path="whole.parquet", **SRC), tmp_path / "one", tmp_path)
    assert sha256_file(tmp_path / "many/records.parquet") == sha256_file(tmp_path / "one/records.parquet")
    assert (many["rows_in"], many["rows_out"], many["duplicates"]) == (103, 100, 3)
    assert many["inputs"] == {n: sha256_file(tmp_path / n) for n in names}


def test_a_max_rows_cut_leaves_the_later_files_unread(tmp_path):
    names = _shards(tmp_path, _rows(90), [30, 60])
    manifest = ingest_source("m", SourceConfig(path="data/*.parquet", max_rows=40, **SRC), tmp_path / "o", tmp_path)
    assert manifest["rows_in"] == 40
    assert manifest["inputs"][names[2]] == "unread (max_rows)"
    assert manifest["inputs"][names[1]] == sha256_file(tmp_path / names[1])


def test_every_file_must_hold_the_columns_and_a_glob_must_match(tmp_path):
    _shards(tmp_path, _rows(20), [10])
    pq.write_table(pa.Table.from_pylist([{"id": "x", "prompt": "p"}]), tmp_path / "data/train-00002.parquet")
    with pytest.raises(DataError, match=r"train-00002\.parquet: missing column 'answer'"):
        ingest_source("m", SourceConfig(path="data/*.parquet", **SRC), tmp_path / "o", tmp_path)
    with pytest.raises(DataError, match=r"nothing-\*\.parquet: no file matches the pattern"):
        ingest_source("m", SourceConfig(path="data/nothing-*.parquet", **SRC), tmp_path / "o", tmp_path)
    assert not (tmp_path / "o").exists()


def test_source_config_takes_one_of_path_url_urls_and_pins_only_one_file():
    with pytest.raises(ValueError, match="exactly one of path"):
        SourceConfig(path="a.parquet", urls=("http://x/a.parquet",), **SRC)
    with pytest.raises(ValueError, match="sha256 pins one file"):
        SourceConfig(path="data/*.parquet", sha256="0" * 64, **SRC)
    with pytest.raises(ValueError, match="url must start with http"):
        SourceConfig(urls=("ftp://x/a.parquet",), **SRC)


def test_urls_of_parquet_shards_ingest_like_the_local_files(tmp_path):
    names = _shards(tmp_path, _rows(70), [25, 50])
    local = ingest_source("m", SourceConfig(path="data/*.parquet", **SRC), tmp_path / "local", tmp_path)
    with LoopbackServer() as server:
        urls = tuple(server.serve(f"/ds/resolve/main/{n}", (tmp_path / n).read_bytes()) for n in names)
        remote = ingest_source("m", SourceConfig(urls=urls, http=FAST, **SRC), tmp_path / "remote", tmp_path)
    assert sha256_file(tmp_path / "remote/records.parquet") == sha256_file(tmp_path / "local/records.parquet")
    assert list(remote["inputs"].values()) == list(local["inputs"].values())  # the same bytes, hashed the same
    assert sorted(remote["inputs"]) == sorted(urls)


def test_a_corpus_source_reads_a_glob_of_files_in_order(tmp_path):
    texts = documents("stories", 40)
    (tmp_path / "c").mkdir()
    for k in range(2):
        (tmp_path / f"c/part-{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                            for t in texts[20 * k:20 * (k + 1)]))
    pq.write_table(pa.Table.from_pylist([{"text": t} for t in texts]), tmp_path / "whole.parquet")
    tok = Tokenizer.from_pretrained()
    many = build_corpus(CorpusConfig(sources={"s": CorpusSourceConfig(path="c/part-*.jsonl")}), tok, tmp_path)
    one = build_corpus(CorpusConfig(sources={"s": CorpusSourceConfig(path="whole.parquet")}), tok, tmp_path)
    assert (many.train.tokens == one.train.tokens).all() and (many.heldout.starts == one.heldout.starts).all()
    assert sorted(many.stats["s"]["sha256"]) == [str(tmp_path / f"c/part-{k}.jsonl") for k in range(2)]
