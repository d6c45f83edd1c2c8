"""align.data.hub and `url` sources of ingest, against a loopback HTTP server started by each test: range
requests, a server that drops mid-file, one that lies about the length, one without ranges, 404 / 401 / 5xx."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.config import from_dict
from align.data.hub import HttpConfig, RemoteFile, iter_lines, stream
from align.data.ingest_parquet import RECORDS, SourceConfig, ingest_source
from align.exceptions import ConfigError, DataError
from align.utils.manifest import manifest_digest, read_manifest
from tests.data.loopback_http import LoopbackServer

FAST = HttpConfig(timeout_s=10.0, retries=3, backoff_s=0.0, chunk_bytes=4096)


def _gsm8k_rows(n: int) -> list[dict]:
    return [{"question": f"Ann has {i} pens and gets 3 more. How many?", "answer": f"{i}+3=<<{i}+3={i + 3}>>{i + 3}"
             f"\n#### {i + 3}"} for i in range(n)]


def _jsonl(rows: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _parquet(tmp_path, n: int = 12000, row_group_size: int = 1500) -> bytes:
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_gsm8k_rows(n)), path, row_group_size=row_group_size)
    return path.read_bytes()


@pytest.fixture
def server():
    with LoopbackServer() as s:
        yield s


# ---------------------------------------------------------------------------------------------------- streaming

def test_stream_delivers_the_file_and_its_hash(server):
    data = _jsonl(_gsm8k_rows(200))
    streamed = stream(server.serve("/d/train.jsonl", data), FAST)
    lines = list(iter_lines(streamed))
    assert b"\n".join(lines) + b"\n" == data and len(lines) == 200
    assert streamed.sha256 == hashlib.sha256(data).hexdigest() and streamed.requests == 1


def test_a_dropped_connection_resumes_by_range(server):
    data = _jsonl(_gsm8k_rows(300))
    streamed = stream(server.serve("/d/train.jsonl", data, drops=2), FAST)
    assert b"".join(streamed) == data and streamed.sha256 == hashlib.sha256(data).hexdigest()
    ranges = server.ranges_of("/d/train.jsonl")
    assert ranges[0] is None and len(ranges) == 3
    first_cut = len(data) // 2  # the first answer delivered half the file
    assert ranges[1] == f"bytes={first_cut}-"  # restarted where it stopped, not from 0
    assert int(ranges[2][6:-1]) > first_cut


def test_a_server_without_ranges_is_reread_and_skipped(server):
    data = _jsonl(_gsm8k_rows(300))
    streamed = stream(server.serve("/d/x.jsonl", data, drops=1, ranges=False), FAST)
    assert b"".join(streamed) == data and streamed.sha256 == hashlib.sha256(data).hexdigest()
    assert streamed.requests == 2


def test_a_server_lying_about_the_length_is_a_truncation(server):
    data = _jsonl(_gsm8k_rows(50))
    url = server.serve("/d/lie.jsonl", data, extra_length=100)
    with pytest.raises(DataError, match=rf"{url}: .*truncated"):
        b"".join(stream(url, FAST))


def test_drops_beyond_the_retry_budget_fail_naming_the_url_and_bytes(server):
    data = _jsonl(_gsm8k_rows(400))
    url = server.serve("/d/flaky.jsonl", data, drops=100, ranges=False)  # every answer cut in half
    with pytest.raises(DataError, match=rf"{url}: truncated: got \d+ of {len(data)} bytes.*3 restarts"):
        b"".join(stream(url, FAST))


@pytest.mark.parametrize("status, words", [(404, "not found"), (401, "unauthorised"), (403, "forbidden")])
def test_final_statuses_are_named_and_not_retried(server, status, words):
    url = server.serve("/d/gone.jsonl", b"{}\n", fail_status=status)
    with pytest.raises(DataError, match=rf"{url}: HTTP {status} {words}"):
        b"".join(stream(url, FAST))
    assert len(server.ranges_of("/d/gone.jsonl")) == 1


def test_an_unknown_file_is_a_404(server):
    with pytest.raises(DataError, match=r"/nothing/here\.parquet: HTTP 404 not found"):
        RemoteFile(server.url("/nothing/here.parquet"), FAST)


def test_server_errors_are_retried_then_fail(server):
    url = server.serve("/d/busy.jsonl", b"{}\n", fail_status=503)
    with pytest.raises(DataError, match=rf"{url}: truncated: got 0 bytes, .*HTTP 503"):
        b"".join(stream(url, FAST))
    assert len(server.ranges_of("/d/busy.jsonl")) == FAST.retries + 1


def test_bearer_token_from_the_named_variable(server, monkeypatch):
    data = _jsonl(_gsm8k_rows(3))
    url = server.serve("/gated/train.jsonl", data, token="s3cret")
    with pytest.raises(DataError, match="HTTP 401 unauthorised"):
        b"".join(stream(url, FAST))
    monkeypatch.setenv("ALIGN_TEST_HUB_TOKEN", "s3cret")
    cfg = HttpConfig(retries=0, token_env="ALIGN_TEST_HUB_TOKEN")
    assert b"".join(stream(url, cfg)) == data


# ---------------------------------------------------------------------------------------------------- RemoteFile

def test_remote_file_reads_by_ranges_and_seeks(server):
    data = bytes(range(256)) * 64
    f = RemoteFile(server.serve("/bin", data), FAST)
    assert f.size == len(data)
    f.seek(-10, 2)
    assert f.read(100) == data[-10:] and f.read(5) == b""
    f.seek(1000)
    assert f.read(300) == data[1000:1300] and f.tell() == 1300
    assert f.requests[-1] == (1000, 300)


def test_remote_file_restarts_a_cut_range(server):
    data = bytes(range(256)) * 64
    f = RemoteFile(server.serve("/bin", data, drops=3), FAST)  # the probe (1 byte, whole) and two cut reads
    f.seek(512)
    assert f.read(4000) == data[512:4512]
    assert f.requests == [(512, 4000), (2512, 2000), (3512, 1000)]


def test_remote_file_needs_ranges(server):
    url = server.serve("/x.parquet", b"PAR1", ranges=False)
    with pytest.raises(DataError, match=rf"{url}: the server ignores range requests"):
        RemoteFile(url, FAST)


# ---------------------------------------------------------------------------------------------------- ingest

def _source(url: str, **kw) -> SourceConfig:
    return SourceConfig(url=url, kind="prompts", format="gsm8k", http=FAST, **kw)


def test_parquet_over_http_equals_the_local_ingest(server, tmp_path):
    data = _parquet(tmp_path)
    url = server.serve("/datasets/gsm8k/resolve/main/train.parquet", data)
    local = ingest_source("g", SourceConfig(path=str(tmp_path / "train.parquet"), kind="prompts", format="gsm8k"),
                          tmp_path / "local")
    remote = ingest_source("g", _source(url), tmp_path / "remote")
    assert pq.read_table(tmp_path / "remote" / RECORDS).equals(pq.read_table(tmp_path / "local" / RECORDS))
    assert manifest_digest(tmp_path / "remote") == manifest_digest(tmp_path / "local")
    assert remote["inputs"] == {url: local["inputs"][str(tmp_path / "train.parquet")]}
    assert remote["inputs"][url] == hashlib.sha256(data).hexdigest()
    read_manifest(tmp_path / "remote", kind="records", verify_hashes=True)
    ranges = server.ranges_of("/datasets/gsm8k/resolve/main/train.parquet")
    reads = [r for r in ranges if r is not None]
    assert len(reads) > pq.ParquetFile(tmp_path / "train.parquet").num_row_groups  # footer + per row group
    spans = [int(b) - int(a) + 1 for a, b in (r[6:].split("-") for r in reads)]
    assert max(spans) < len(data) // 4  # by row groups (and a 64 KiB footer read), never the whole file
    assert ranges.count(None) == 1  # the one sequential pass that hashes the content


def test_parquet_over_a_dropping_server_gives_the_same_records(server, tmp_path):
    data = _parquet(tmp_path, n=1500, row_group_size=300)
    local = ingest_source("g", SourceConfig(path=str(tmp_path / "train.parquet"), kind="prompts", format="gsm8k"),
                          tmp_path / "local")
    remote = ingest_source("g", _source(server.serve("/t.parquet", data, drops=3)), tmp_path / "remote")
    assert manifest_digest(tmp_path / "remote") == manifest_digest(tmp_path / "local")
    assert list(remote["inputs"].values()) == list(local["inputs"].values())


def test_parquet_from_a_server_lying_about_the_length_fails_cleanly(server, tmp_path):
    url = server.serve("/lie.parquet", _parquet(tmp_path, n=200), extra_length=5000)
    with pytest.raises(DataError, match=rf"{url}: "):
        ingest_source("g", _source(url), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.partial-*"))


def test_jsonl_over_http_counts_and_names_bad_rows(server, tmp_path):
    rows = _gsm8k_rows(300)
    body = _jsonl(rows[:100]) + b"{not json\n" + _jsonl([{"question": "Q?", "answer": 7}]) + b"[1, 2]\n" \
        + _jsonl(rows[100:])
    url = server.serve("/gsm8k/main/train.jsonl", body, drops=1)
    manifest = ingest_source("g", _source(url, max_reject_fraction=0.05), tmp_path / "out")
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rejected"]) == (303, 300, 3)
    assert [(r["row"], r["column"]) for r in manifest["rejections"]] == [(100, "<line>"), (101, "answer"),
                                                                         (102, "<line>")]
    assert manifest["rejections"][1]["reason"] == "expected a string, got int"
    assert manifest["inputs"] == {url: hashlib.sha256(body).hexdigest()}
    golds = [r["gold"] for r in pq.read_table(tmp_path / "out" / RECORDS).to_pylist()]
    assert golds == [str(i + 3) for i in range(300)]


def test_local_jsonl_hashes_like_its_http_copy(server, tmp_path):
    body = _jsonl(_gsm8k_rows(40))
    (tmp_path / "train.jsonl").write_bytes(body)
    local = ingest_source("g", SourceConfig(path="train.jsonl", kind="sft", format="gsm8k"), tmp_path / "a",
                          base_dir=tmp_path)
    remote = ingest_source("g", SourceConfig(url=server.serve("/train.jsonl", body), kind="sft", format="gsm8k",
                                             http=FAST), tmp_path / "b")
    assert manifest_digest(tmp_path / "a") == manifest_digest(tmp_path / "b")
    assert list(local["inputs"].values()) == list(remote["inputs"].values())


def test_a_pinned_hash_refuses_a_different_file(server, tmp_path):
    url = server.serve("/train.jsonl", _jsonl(_gsm8k_rows(5)))
    with pytest.raises(DataError, match=rf"{url}: content sha256 is [0-9a-f]{{64}}, the source pins 0+"):
        ingest_source("g", _source(url, sha256="0" * 64), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    good = hashlib.sha256(_jsonl(_gsm8k_rows(5))).hexdigest()
    assert ingest_source("g", _source(url, sha256=good), tmp_path / "out")["rows_out"] == 5


def test_a_missing_column_in_jsonl_names_the_first_rows_keys(server, tmp_path):
    url = server.serve("/m.jsonl", _jsonl([{"question": "q", "solution": "s"}]))
    with pytest.raises(DataError, match=r"missing column 'answer' .*columns present: question, solution"):
        ingest_source("g", _source(url), tmp_path / "out")


def test_source_config_from_toml_tables():
    src = from_dict(SourceConfig, {"url": "https://huggingface.co/datasets/openai/gsm8k/resolve/main/main/"
                                          "train-00000-of-00001.parquet", "kind": "prompts", "format": "gsm8k",
                                   "http": {"retries": 2, "token_env": "HF_TOKEN"}})
    assert src.http.retries == 2 and src.location.startswith("https://")
    with pytest.raises(ConfigError, match="exactly one of path .* and url"):
        from_dict(SourceConfig, {"path": "a.parquet", "url": "https://x/a.parquet", "kind": "sft", "format": "gsm8k"})
    with pytest.raises(ConfigError, match="exactly one of path"):
        from_dict(SourceConfig, {"kind": "sft", "format": "gsm8k"})
    with pytest.raises(ConfigError, match="url must start with http"):
        from_dict(SourceConfig, {"url": "ftp://x/a.parquet", "kind": "sft", "format": "gsm8k"})


def test_a_hub_redirect_to_its_cdn_keeps_ranges_and_drops_the_token(server, tmp_path, monkeypatch):
    data = _parquet(tmp_path, n=3000, row_group_size=500)
    server.serve("/cdn/abc123", data)
    url = server.serve("/datasets/x/resolve/main/train.parquet", b"", redirect_to="/cdn/abc123")
    monkeypatch.setenv("ALIGN_TEST_HUB_TOKEN", "s3cret")
    http = HttpConfig(retries=1, backoff_s=0.0, token_env="ALIGN_TEST_HUB_TOKEN")
    manifest = ingest_source("g", SourceConfig(url=url, kind="prompts", format="gsm8k", http=http), tmp_path / "out")
    assert manifest["rows_out"] == 3000 and manifest["inputs"] == {url: hashlib.sha256(data).hexdigest()}
    cdn = server.ranges_of("/cdn/abc123")
    assert len(cdn) == len(server.ranges_of("/datasets/x/resolve/main/train.parquet")) > 3
    assert cdn[0] == "bytes=0-0" and None in cdn  # the Range header survived the redirect
    assert all(sent for path, sent in server.authorised if path.startswith("/datasets/"))
    assert not any(sent for path, sent in server.authorised if path.startswith("/cdn/"))
