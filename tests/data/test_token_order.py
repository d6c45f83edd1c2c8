"""The pretraining corpus and its token-addressed order: windows over packed documents with document masking, the
weighted mixture, world-size invariance, exact resume at any world size, the held-out slice, bad rows named."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.collate import IGNORE_INDEX
from align.data.pretrain_corpus import Corpus, CorpusConfig, CorpusSourceConfig, Split, build_corpus
from align.data.synthetic_corpus import documents
from align.data.token_order import TokenLoader, TokenLoaderConfig, heldout_batches, mixture_documents
from align.exceptions import ArtifactError, ConfigError, DataError
from align.tokenizer import Tokenizer


def _corpus(sizes=(40, 20), weights=(3.0, 1.0), seed=0) -> Corpus:
    """Documents whose tokens say who they are: token = 1000 * (doc + 1) + position, lengths 5..24."""
    rng = np.random.default_rng(seed)
    docs, source = [], []
    for s, n in enumerate(sizes):
        for _ in range(n):
            d = len(docs)
            docs.append(1000 * (d + 1) + np.arange(int(rng.integers(5, 25))))
            source.append(s)
    lengths = np.array([len(d) for d in docs])
    train = Split(np.concatenate(docs), np.concatenate([[0], np.cumsum(lengths)]), np.array(source))
    heldout = Split(np.arange(100, 160), np.array([0, 30, 60]), np.array([0, 1]))
    return Corpus(("a", "b")[:len(sizes)], tuple(weights[:len(sizes)]), train, heldout, {})


def _global(loader: TokenLoader, steps: int, world: int) -> list[list[np.ndarray]]:
    """Every rank's micro-batches for `steps` steps, put back in global order (micro-batch a*world + r)."""
    ranks = [TokenLoader(loader.corpus, loader.cfg, loader.seed, rank=r, world_size=world) for r in range(world)]
    for r in ranks:
        r.load_state_dict(loader.state_dict() | {"step": loader.step})
    out = []
    iters = [iter(r) for r in ranks]
    for _ in range(steps):
        per_rank = [next(it).micro_batches for it in iters]
        for a in range(len(per_rank[0])):
            out.extend(per_rank[r][a]["input_ids"].numpy() for r in range(world))
    return out


def test_windows_tile_the_epoch_stream_and_mask_documents():
    corpus, cfg = _corpus(), TokenLoaderConfig(seq_len=16, micro_batch_size=2)
    loader = TokenLoader(corpus, cfg, seed=3, rank=0, world_size=1)
    stream = loader.stream(0)
    train = corpus.train
    flat = np.concatenate([train.tokens[train.starts[d]:train.starts[d + 1]] for d in stream.docs])
    k_all = [loader.instance(k) for k in range(stream.instances)]
    assert np.array_equal(np.concatenate([w["input_ids"] for w in k_all]), flat[:stream.instances * 16])
    for w in k_all:
        doc_of = w["input_ids"] // 1000  # the document each token came from
        starts = np.flatnonzero(np.diff(doc_of)) + 1
        assert np.array_equal(w["document_ids"], np.concatenate([[0], np.cumsum(np.diff(doc_of) != 0)]))
        assert all(w["position_ids"][s] == 0 for s in starts) and w["position_ids"][0] == 0
        first_tokens = (w["input_ids"] % 1000) == 0  # position 0 of a document: never a target
        assert np.array_equal(w["labels"] == IGNORE_INDEX, first_tokens)
        assert np.array_equal(w["labels"][~first_tokens], w["input_ids"][~first_tokens])


def test_mixture_realises_the_weights_within_a_document():
    corpus = _corpus(sizes=(40, 40), weights=(3.0, 1.0))
    docs = mixture_documents(corpus, TokenLoaderConfig(seq_len=16), seed=1, epoch=0)
    lengths, source = corpus.train.lengths[docs], corpus.train.source[docs]
    share_a = lengths[source == 0].sum() / lengths.sum()
    assert abs(share_a - 0.75) < 25 / lengths.sum() + 0.01  # at most one document over each target
    assert len(set(docs[source == 1].tolist())) < 40 and len(np.unique(docs[source == 0])) == 40  # a cycles
    other = mixture_documents(corpus, TokenLoaderConfig(seq_len=16), seed=1, epoch=1)
    assert not np.array_equal(docs[:20], other[:20])  # each epoch its own order
    with pytest.raises(ConfigError, match=r"source 'a' has \d+ training tokens.*max_repetition"):
        mixture_documents(corpus, TokenLoaderConfig(seq_len=16, max_repetition=1.0), seed=1, epoch=0)


@pytest.mark.parametrize("world, accum", [(2, 2), (4, 1)])
def test_the_global_stream_does_not_depend_on_the_world_size(world, accum):
    corpus = _corpus()
    one = TokenLoader(corpus, TokenLoaderConfig(seq_len=16, micro_batch_size=2, grad_accum=4), seed=5, rank=0,
                      world_size=1)
    many = TokenLoader(corpus, TokenLoaderConfig(seq_len=16, micro_batch_size=2, grad_accum=accum), seed=5, rank=0,
                       world_size=world)
    a, b = _global(one, 8, 1), _global(many, 8, world)
    assert len(a) == len(b) == 32 and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert one.stream(0).instances < 8 * 8  # the steps ran into epoch 1 without a gap


def test_resume_continues_at_the_same_token_at_another_world_size():
    corpus = _corpus()
    cfg = TokenLoaderConfig(seq_len=16, micro_batch_size=2, grad_accum=2)
    full = TokenLoader(corpus, cfg, seed=9, rank=0, world_size=1)
    it = iter(full)
    batches = [next(it) for _ in range(5)]
    cut = TokenLoader(corpus, cfg, seed=9, rank=0, world_size=1)
    cit = iter(cut)
    for _ in range(3):
        next(cit)
    state = json.loads(json.dumps(cut.state_dict()))
    assert state["tokens"] == 3 * 4 * 16
    resumed = TokenLoader(corpus, cfg, seed=9, rank=0, world_size=1)
    resumed.load_state_dict(state)
    nxt = next(iter(resumed))
    assert nxt.step == 3 and all(np.array_equal(x["input_ids"], y["input_ids"])
                                 for x, y in zip(nxt.micro_batches, batches[3].micro_batches))
    two = TokenLoader(corpus, TokenLoaderConfig(seq_len=16, micro_batch_size=2, grad_accum=1), seed=9, rank=1,
                      world_size=2)
    two.load_state_dict(state)  # same global batch on 2 ranks: rank 1 takes the second micro-batch of step 3
    assert np.array_equal(next(iter(two)).micro_batches[0]["input_ids"], batches[3].micro_batches[1]["input_ids"])


def test_resume_refuses_a_changed_order():
    corpus = _corpus()
    loader = TokenLoader(corpus, TokenLoaderConfig(seq_len=16), seed=1, rank=0, world_size=1)
    state = loader.state_dict()
    with pytest.raises(ArtifactError, match="order was .*resuming would not continue the same data order"):
        TokenLoader(corpus, TokenLoaderConfig(seq_len=32), seed=1, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ArtifactError, match="corpus was"):
        TokenLoader(_corpus(seed=1), TokenLoaderConfig(seq_len=16), seed=1, rank=0,
                    world_size=1).load_state_dict(state)


def test_step_counts_label_tokens_of_every_rank():
    corpus = _corpus()
    loader = TokenLoader(corpus, TokenLoaderConfig(seq_len=16, micro_batch_size=2, grad_accum=2), seed=2, rank=0,
                         world_size=1)
    step = next(iter(loader))
    counted = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in step.micro_batches)
    assert step.global_loss_tokens == counted and step.global_rows == 4
    assert step.micro_batches[0]["attention_mask"].all()


def test_heldout_batches_are_document_order_windows():
    batches = heldout_batches(_corpus(), seq_len=16, batch_size=2, max_windows=3)
    assert [b["input_ids"].shape for b in batches] == [(2, 16), (1, 16)]
    assert batches[0]["input_ids"][0].tolist() == list(range(100, 116))
    second = {k: v[1].tolist() for k, v in batches[0].items()}  # tokens 16..31: the tail of doc 0, then doc 1
    assert second["document_ids"] == [0] * 14 + [1] * 2 and second["position_ids"] == list(range(14)) + [0, 1]
    assert second["labels"][14] == IGNORE_INDEX and second["labels"][:14] == list(range(116, 130))


def test_build_corpus_splits_rejects_and_names(tmp_path):
    rows = [{"text": t} for t in documents("stories", 60)] + [{"text": ""}, {"text": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "stories.parquet")
    (tmp_path / "facts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in documents("facts", 30)))
    cfg = CorpusConfig(sources={"stories": CorpusSourceConfig(path="stories.parquet", weight=2.0),
                                "facts": CorpusSourceConfig(path="facts.jsonl")}, heldout_every=10,
                       max_reject_fraction=0.05)
    tok = Tokenizer.from_pretrained()
    corpus = build_corpus(cfg, tok, tmp_path)
    assert corpus.names == ("facts", "stories") and corpus.weights == (1.0, 2.0)
    assert (len(corpus.train), len(corpus.heldout)) == (81, 9)
    assert corpus.stats["stories"]["rejected"] == 2
    assert [r["row"] for r in corpus.stats["stories"]["rejections"]] == [60, 61]
    first = corpus.train.tokens[corpus.train.starts[0]:corpus.train.starts[1]]
    assert first[0] == tok.bos_id and first[-1] == tok.eos_id
    assert tok.decode(first[1:-1].tolist()) == documents("facts", 1)[0]
    assert corpus.digest == build_corpus(cfg, tok, tmp_path).digest
    with pytest.raises(DataError, match=r"stories\.parquet: 2 of 62 rows rejected.*row 60, column 'text'"):
        build_corpus(CorpusConfig(sources=cfg.sources), tok, tmp_path)
    with pytest.raises(DataError, match=r"missing text column 'body' \(corpus\.sources\.facts\.text_column\)"):
        build_corpus(CorpusConfig(sources={"facts": CorpusSourceConfig(path="facts.jsonl", text_column="body")}),
                     tok, tmp_path)


def test_instances_are_numbered_across_epochs():
    loader = TokenLoader(_corpus(), TokenLoaderConfig(seq_len=16), seed=4, rank=0, world_size=1)
    n0, n1 = loader.stream(0).instances, loader.stream(1).instances
    assert loader.locate(n0 + n1 + 3) == (2, 3) and loader.locate(n0 - 1) == (0, n0 - 1)
    assert loader.locate(n0) == (1, 0)  # asked after epoch 2: the remembered sizes still answer


@pytest.mark.parametrize("packing", ["greedy", "ffd"])
def test_bin_rows_hold_whole_pieces(packing):
    corpus = _corpus(sizes=(40, 20))
    cfg = TokenLoaderConfig(seq_len=16, micro_batch_size=2, packing=packing, pad_id=7)
    loader = TokenLoader(corpus, cfg, seed=3, rank=0, world_size=1)
    stream = loader.stream(0)
    train, seen = corpus.train, {}
    for k in range(stream.instances):
        row = loader.instance(k)
        pad = row["document_ids"] == -1
        assert np.array_equal(row["attention_mask"], ~pad) and (row["input_ids"][pad] == 7).all()
        assert (row["labels"][pad] == IGNORE_INDEX).all()
        for d in np.unique(row["document_ids"][~pad]):
            at = np.flatnonzero(row["document_ids"] == d)
            tokens = row["input_ids"][at]
            doc = int(tokens[0] // 1000 - 1)
            assert (tokens // 1000 == doc + 1).all() and np.array_equal(row["position_ids"][at], np.arange(len(at)))
            assert row["labels"][at[0]] == IGNORE_INDEX and np.array_equal(row["labels"][at[1:]], tokens[1:])
            seen.setdefault(doc, []).extend((tokens % 1000).tolist())
    picked = np.unique(stream.doc)
    for doc in picked.tolist():  # every piece of every picked document, each token once per pick
        n = int(train.lengths[doc])
        picks = int((stream.doc == doc).sum()) // -(-n // 16)
        assert sorted(seen[doc]) == sorted(list(range(n)) * picks)


def test_ffd_fills_rows_better_than_greedy_and_long_documents_are_cut():
    corpus = _corpus(sizes=(40, 20))
    rows = {p: TokenLoader(corpus, TokenLoaderConfig(seq_len=16, packing=p), seed=3, rank=0,
                           world_size=1).stream(0) for p in ("greedy", "ffd")}
    assert rows["ffd"].instances < rows["greedy"].instances
    assert (rows["ffd"].length <= 16).all() and (rows["ffd"].offset > 0).any()  # documents of 17-24 tokens: cut


@pytest.mark.parametrize("packing", ["greedy", "ffd"])
def test_bin_rows_are_world_size_invariant(packing):
    corpus = _corpus()
    one = TokenLoader(corpus, TokenLoaderConfig(seq_len=16, micro_batch_size=2, grad_accum=2, packing=packing),
                      seed=5, rank=0, world_size=1)
    two = TokenLoader(corpus, TokenLoaderConfig(seq_len=16, micro_batch_size=2, grad_accum=1, packing=packing),
                      seed=5, rank=0, world_size=2)
    a, b = _global(one, 5, 1), _global(two, 5, 2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == 10
