"""Shard build and ShardSet: contents match the tokenizer, both cores give the same bytes, a crashed build resumes,
and every kind of mismatch is refused."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from align.data import shard_build
from align.data.schema import from_row
from align.data.shard_build import ShardBuildConfig, build_shards
from align.data.store import ShardSet
from align.exceptions import ArtifactError
from align.tokenizer import Tokenizer, TokenizerConfig


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_pretrained()


def test_sft_rows_are_the_chat_template_with_its_loss_mask(shard_sets, tok):
    shards = ShardSet.open(shard_sets["sft"], kind="sft", tokenizer_hash=tok.content_hash, verify_hashes=True)
    records = pq.read_table(shard_sets["sft-records"] / "records.parquet").to_pylist()
    assert len(shards) == len(records) == 61
    assert len(shards.manifest["shards"]) == 4  # 16 rows per records row group
    for i in (0, 17, 60):
        enc = tok.encode_chat([{"role": m.role, "content": m.content}
                               for m in from_row("sft", records[i]).messages])
        ids, mask = shards.sequence(i)
        assert ids.tolist() == enc.ids and mask.tolist() == enc.loss_mask
        assert shards.meta(i)["id"] == records[i]["id"]
    assert shards.manifest["tokens"] == int(shards.row_lengths.sum())
    assert shards.manifest["loss_tokens"] == int(shards.row_loss_tokens.sum()) > 0
    assert shards.manifest["token_dtype"] == "uint16"


def test_pairs_share_the_prompt_and_prompts_keep_gold(shard_sets, tok):
    pairs = ShardSet.open(shard_sets["pairs"], kind="pairs")
    (c_ids, c_mask), (r_ids, r_mask) = pairs.sequence(5, 0), pairs.sequence(5, 1)
    prompt_len = int(np.argmax(c_mask))
    assert c_ids[:prompt_len].tolist() == r_ids[:prompt_len].tolist() and c_ids.tolist() != r_ids.tolist()
    assert c_ids[prompt_len - 1] == tok.token_to_id("[/INST]") and c_ids[-1] == r_ids[-1] == tok.eos_id
    prompts = ShardSet.open(shard_sets["prompts"], kind="prompts")
    ids, mask = prompts.sequence(4)
    assert ids.tolist() == tok.encode_prompt([{"role": "user", "content": "What is 4 times 3?"}])
    assert not mask.any() and prompts.meta(4)["gold"] == "12"


def test_two_workers_build_the_same_bytes_as_one(tmp_path, shard_sets):
    records = shard_sets["sft-records"]
    one = build_shards(records, tmp_path / "one", TokenizerConfig(), ShardBuildConfig(workers=1))
    two = build_shards(records, tmp_path / "two", TokenizerConfig(), ShardBuildConfig(workers=2))
    assert one["files"] == two["files"]


def test_a_crashed_build_resumes_with_its_done_shards(tmp_path, shard_sets, monkeypatch):
    records = shard_sets["sft-records"]
    real = shard_build.build_one
    calls = []

    def crash_on_third(job):
        calls.append(job.index)
        if job.index == 2:
            raise RuntimeError("simulated crash")
        return real(job)

    monkeypatch.setattr(shard_build, "build_one", crash_on_third)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_shards(records, tmp_path / "out", TokenizerConfig(), ShardBuildConfig(workers=1))
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(shard_build, "build_one", lambda job: calls.append(job.index) or real(job))
    calls.clear()
    manifest = build_shards(records, tmp_path / "out", TokenizerConfig(), ShardBuildConfig(workers=1))
    assert calls == [2, 3] and manifest["reused_shards"] == 2
    reference = build_shards(records, tmp_path / "ref", TokenizerConfig(), ShardBuildConfig(workers=1))
    assert manifest["files"] == reference["files"]
    assert not (tmp_path / "out.building").exists()


def test_a_leftover_build_of_other_inputs_is_discarded(tmp_path, shard_sets):
    records = shard_sets["sft-records"]
    stale = tmp_path / "out.building"
    stale.mkdir()
    (stale / ".build.json").write_text(json.dumps({"records": "something else"}))
    (stale / ".shard-00000.done").write_text("{}")
    manifest = build_shards(records, tmp_path / "out", TokenizerConfig(), ShardBuildConfig(workers=1))
    assert manifest["reused_shards"] == 0


def test_too_long_rows_are_dropped_and_counted(tmp_path, records_factory):
    records = records_factory(tmp_path, "sft", 20)
    from align.data.encoding import EncodingConfig

    manifest = build_shards(records, tmp_path / "out", TokenizerConfig(),
                            ShardBuildConfig(encoding=EncodingConfig(max_len=40), workers=1))
    shards = ShardSet.open(tmp_path / "out")
    assert manifest["dropped_too_long"] > 0 and len(shards) == 20 - manifest["dropped_too_long"]
    assert shards.row_lengths.max() <= 40
    truncated = build_shards(records, tmp_path / "cut", TokenizerConfig(),
                             ShardBuildConfig(encoding=EncodingConfig(max_len=40, too_long="truncate"), workers=1))
    assert truncated["truncated"] == manifest["dropped_too_long"] and truncated["rows"] == 20


# ---------------------------------------------------------------------------------------------------- refusals

@pytest.fixture()
def copy(tmp_path, shard_sets):
    target = tmp_path / "copy"
    shutil.copytree(shard_sets["sft"], target)
    return target


def test_tokenizer_mismatch_is_refused(copy):
    with pytest.raises(ArtifactError, match="built with tokenizer 7010c111ead9, but the tokenizer in use is "
                                            "000000000000; rebuild"):
        ShardSet.open(copy, tokenizer_hash="0" * 64)


def test_wrong_kind_is_refused(copy):
    with pytest.raises(ArtifactError, match="holds 'sft' rows, expected 'pairs'"):
        ShardSet.open(copy, kind="pairs")


def test_missing_manifest_is_refused(copy):
    (copy / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="no manifest.json"):
        ShardSet.open(copy)


def test_truncated_shard_file_is_refused(copy):
    path = copy / "shard-00001.tokens.npy"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ArtifactError, match=r"shard-00001\.tokens\.npy: \d+ bytes, manifest .* says"):
        ShardSet.open(copy)


def test_changed_bytes_are_refused_when_hashes_are_verified(copy):
    path = copy / "shard-00002.masks.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    ShardSet.open(copy, verify_hashes=False)  # sizes match: only hashing notices
    with pytest.raises(ArtifactError, match=r"shard-00002\.masks\.npy: sha256 differs"):
        ShardSet.open(copy)  # the default: every sha256 checked


def test_manifest_counts_that_disagree_with_the_arrays_are_refused(copy):
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][0]["rows"] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="disagree with the manifest"):
        ShardSet.open(copy)


def test_records_manifest_is_required(tmp_path):
    (tmp_path / "records").mkdir()
    with pytest.raises(ArtifactError, match="no manifest.json"):
        build_shards(tmp_path / "records", tmp_path / "out", TokenizerConfig(), ShardBuildConfig(workers=1))
    assert not os.path.exists(tmp_path / "out")
