"""Calibration of the bundled math task: can a tiny from-scratch Mistral learn it partly in a few CPU minutes?

Trains a transformers `MistralForCausalLM` (the reference implementation, so this does not depend on align's own
model or trainer) on `data/raw/math_sft.parquet` for a token budget (what a few CPU minutes buy: ~1,500-4,000 tokens/s), then decodes the held-out
`math_eval.parquet` greedily and prints one JSON line: accuracy per level and overall, tokens/s, loss.

The chat format is written by hand here (`<s>[INST] q [/INST] a</s>` with the vendored tokenizer.json) because the
point is the task's difficulty, not template parity (that is the tokenizer's test).

    .venv/bin/python bench/math_task_learnability.py --tokens 400000 --hidden 128 --layers 4
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "assets/tokenizer/mistral-7b-v0.3/tokenizer.json"
FALLBACK_TOKENIZER = ROOT.parent / "shared/assets/mistral-7b-v0.3/tokenizer.json"
BOS, EOS, INST, END_INST = 1, 2, 3, 4


def load_tokenizer():
    from tokenizers import Tokenizer

    path = TOKENIZER if TOKENIZER.is_file() else FALLBACK_TOKENIZER
    tok = Tokenizer.from_file(str(path))
    return lambda text: tok.encode(text, add_special_tokens=False).ids, tok


def encode_example(enc, question: str, answer: str | None):
    prompt = [BOS, INST] + enc(question) + [END_INST]
    if answer is None:
        return prompt, None
    reply = enc(answer) + [EOS]
    return prompt + reply, [0] * len(prompt) + [1] * len(reply)


def build_model(args, vocab: int):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 4,
                        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=2,
                        head_dim=args.hidden // args.heads, max_position_embeddings=256, tie_word_embeddings=True,
                        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0, sliding_window=None)
    torch.manual_seed(0)
    return MistralForCausalLM(cfg)


def batches(examples, batch_size, gen):
    while True:
        order = torch.randperm(len(examples), generator=gen).tolist()
        for i in range(0, len(order) - batch_size + 1, batch_size):
            rows = [examples[j] for j in order[i:i + batch_size]]
            width = max(len(ids) for ids, _ in rows)
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            labels = torch.full((len(rows), width), -100, dtype=torch.long)
            mask = torch.zeros(len(rows), width, dtype=torch.long)
            for r, (tok, lm) in enumerate(rows):
                ids[r, :len(tok)] = torch.tensor(tok)
                mask[r, :len(tok)] = 1
                labels[r, :len(tok)] = torch.where(torch.tensor(lm) == 1, torch.tensor(tok), -100)
            yield ids, labels, mask


def masked_loss(model, ids, labels, mask):
    """Mean next-token CE over the loss positions only: the 32k-entry head runs on those rows alone (what a fused
    SFT loss does), which halves the head's cost on these short prompts."""
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, D)
    target = labels[:, 1:]
    keep = target != -100
    logits = model.lm_head(hidden[:, :-1][keep])  # (N, V)
    return torch.nn.functional.cross_entropy(logits, target[keep])


def train(model, examples, args, on_checkpoint):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    start, step, tokens, losses, next_eval = time.perf_counter(), 0, 0, [], args.eval_every
    for ids, labels, mask in batches(examples, args.batch, gen):
        if tokens >= args.tokens:
            break
        frac = tokens / args.tokens  # token-budget cosine: comparable across loaded and idle machines
        lr = args.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        loss = masked_loss(model, ids, labels, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        tokens += ids.numel()
        step += 1
        if step % 20 == 0:
            print(f"step {step} tokens {tokens} loss {sum(losses[-20:]) / 20:.4f}", file=sys.stderr, flush=True)
        if args.eval_every and tokens >= next_eval and tokens < args.tokens:
            on_checkpoint(tokens)
            model.train()
            next_eval += args.eval_every
    wall = time.perf_counter() - start
    return dict(steps=step, train_tokens=tokens, wall_s=round(wall, 1), tokens_per_s=round(tokens / wall, 1),
                final_loss=round(sum(losses[-20:]) / max(1, len(losses[-20:])), 4))


@torch.no_grad()
def evaluate(model, decode, enc, rows, max_new=48):
    model.eval()
    correct: dict[int, list[int]] = {}
    for i in range(0, len(rows), 100):
        chunk = rows[i:i + 100]
        prompts = [encode_example(enc, r["prompt"], None)[0] for r in chunk]
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding for generation
        mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             eos_token_id=EOS, pad_token_id=0)
        for r, seq in zip(chunk, out[:, width:].tolist()):
            found = re.findall(r"\\boxed\{(-?\d+)\}", decode(seq))
            correct.setdefault(r["level"], []).append(int(bool(found) and found[-1] == r["answer"]))
    per_level = {f"L{k}": round(sum(v) / len(v), 3) for k, v in sorted(correct.items())}
    allv = [x for v in correct.values() for x in v]
    return per_level, round(sum(allv) / len(allv), 3)


def compact(examples, eval_prompts, enc, tok):
    """Remap ids to a dense range (the proxy of --compact-vocab): same task, a head of ~hundreds of entries."""
    used = sorted({i for ids, _ in examples for i in ids} | {i for p in eval_prompts for i in p} | {0, BOS, EOS,
                                                                                                   INST, END_INST})
    fwd = {old: new for new, old in enumerate(used)}
    examples = [([fwd[i] for i in ids], lm) for ids, lm in examples]

    def enc2(text):
        return [fwd.get(i, 0) for i in enc(text)]

    def decode(ids):
        return tok.decode([used[i] for i in ids if i < len(used)], skip_special_tokens=True)

    return examples, enc2, decode, len(used)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=400_000, help="training budget in (padded) tokens")
    ap.add_argument("--eval-every", type=int, default=0, help="also evaluate every N training tokens (a curve)")
    ap.add_argument("--eval-n", type=int, default=300, help="eval problems used (levels are interleaved)")
    ap.add_argument("--train-n", type=int, default=0, help="also score N SFT training problems (memorisation gap)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compact-vocab", action="store_true", help="fast proxy: dense ids, small head (not the "
                                                                   "real tokenizer's cost; for comparing variants)")
    ap.add_argument("--data", default=str(ROOT / "data/raw"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    enc, tok = load_tokenizer()
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    sft = pq.read_table(Path(args.data) / "math_sft.parquet").to_pylist()
    eval_rows = pq.read_table(Path(args.data) / "math_eval.parquet").to_pylist()[:args.eval_n]
    examples = [encode_example(enc, r["messages"][0]["content"], r["messages"][1]["content"]) for r in sft]
    vocab = 32768
    if args.compact_vocab:
        examples, enc, decode, vocab = compact(examples, [encode_example(enc, r["prompt"], None)[0]
                                                          for r in eval_rows], enc, tok)
    model = build_model(args, vocab)
    curve = []

    train_rows = [{"prompt": r["messages"][0]["content"], "level": r["level"],
                   "answer": re.findall(r"boxed\{(-?\d+)\}", r["messages"][1]["content"])[-1]}
                  for r in sft[:args.train_n]]

    def checkpoint(tokens):
        per_level, acc = evaluate(model, decode, enc, eval_rows)
        point = {"tokens": tokens, "accuracy": acc, **per_level}
        if train_rows:
            point["train_accuracy"] = evaluate(model, decode, enc, train_rows)[1]
        curve.append(point)
        print(f"eval at {tokens}: {point}", file=sys.stderr, flush=True)

    stats = train(model, examples, args, checkpoint)
    checkpoint(stats["train_tokens"])
    print(json.dumps(dict(bench="math_task_learnability", data=args.data, hidden=args.hidden, layers=args.layers,
                          vocab=vocab, train_budget_tokens=args.tokens, batch=args.batch, lr=args.lr,
                          threads=args.threads, **stats, eval_n=len(eval_rows), curve=curve)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
