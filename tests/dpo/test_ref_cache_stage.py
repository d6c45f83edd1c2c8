"""The ref_cache stage worker on real artifacts: builds once, hits on the second run without loading the model,
rebuilds when the checkpoint or the shards change, refuses shards built with another tokenizer, and the cached
numbers equal a direct scoring of the pairs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from align.data.collate import collate
from align.data.store import ShardSet
from align.model.checkpoint import load_checkpoint
from align.kernels.fused_dpo import pair_logprobs
from align.train.ref_cache import RefCache, cache_key
from stage_fixtures import build_pair_shards, pair_rows, run_worker, save_tiny_checkpoint

CONFIG = """include = "common.toml"
reference = "sft_checkpoint/final"
[splits]
preference = "shards/preference/out"
[scoring]
batch_pairs = 5
chunk_size = 16
threads = 1
"""


@pytest.fixture()
def runs(tmp_path):
    runs = tmp_path / "runs"
    save_tiny_checkpoint(runs / "sft_checkpoint" / "final", seed=0)
    build_pair_shards(tmp_path, runs / "shards" / "preference" / "out", pair_rows(12))
    (tmp_path / "common.toml").write_text("[run]\nseed = 3\n")
    (tmp_path / "ref_cache.toml").write_text(CONFIG)
    return runs


def _run(runs, *overrides):
    code = run_worker("align.stages.ref_cache", runs.parent / "ref_cache.toml", runs, runs / "ref_cache", *overrides)
    metrics = json.loads((runs / "ref_cache" / "metrics.json").read_text()) if code == 0 else None
    return code, metrics


def test_build_hit_and_rebuild_on_changed_inputs(runs, monkeypatch):
    code, m = _run(runs)
    assert code == 0 and m["preference"]["hit"] is False and m["preference"]["rows"] == 12

    # the cached numbers are the reference's log-probs of each pair, row by row
    shards = ShardSet.open(runs / "shards" / "preference" / "out")
    model = load_checkpoint(runs / "sft_checkpoint" / "final").eval()
    with torch.no_grad():
        direct = pair_logprobs(model, collate(shards, list(range(12))), chunk_size=1024)
    key = cache_key(runs / "sft_checkpoint" / "final", shards.digest, shards.tokenizer_hash, "float32")
    cache = RefCache.open(runs / "ref_cache" / "preference", key, 12)
    ref = cache.lookup(torch.arange(12))
    torch.testing.assert_close(ref.chosen, direct.chosen, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(ref.rejected, direct.rejected, atol=1e-4, rtol=1e-5)

    # second run: a hit, and the reference model is never loaded
    import align.model.checkpoint as ckpt

    def refuse(*a, **k):
        raise AssertionError("the reference model was loaded on a cache hit")

    monkeypatch.setattr(ckpt, "load_checkpoint", refuse)
    code, m = _run(runs)
    assert code == 0 and m["preference"]["hit"] is True
    monkeypatch.undo()

    save_tiny_checkpoint(runs / "sft_checkpoint" / "final", seed=1)  # a new reference checkpoint
    code, m = _run(runs)
    assert code == 0 and m["preference"]["hit"] is False

    shutil.rmtree(runs / "shards")  # new shards: one more pair
    build_pair_shards(runs.parent, runs / "shards" / "preference" / "out", pair_rows(13))
    code, m = _run(runs)
    assert code == 0 and m["preference"]["hit"] is False and m["preference"]["rows"] == 13


def test_shards_of_another_tokenizer_are_refused(runs, tmp_path, capsys):
    from align.tokenizer.tokenizer import resolve_tokenizer_dir

    other = tmp_path / "tok"
    other.mkdir()
    spec = json.loads((resolve_tokenizer_dir(None) / "tokenizer.json").read_text())
    (other / "tokenizer.json").write_text(json.dumps(spec, indent=1))  # same tokens, other bytes: other identity
    code, _ = _run(runs, f"tokenizer.path={other}")
    assert code == 2
    assert "built with tokenizer" in capsys.readouterr().err
