"""Linear probes of a frozen causal-LM trunk on the preference pairs: is "chosen right, rejected wrong" linearly
readable from one position's hidden state before any trunk training? A Bradley-Terry reward model whose trunk stays
frozen is exactly a logistic regression on h(chosen) - h(rejected) (no bias: it cancels in the difference), so the
probe's held-out pair accuracy is what the rm_checkpoint rung's score head could reach without moving the trunk;
the gap to a trained reward model is what the trunk has to learn. Prints ONE JSON line.

Features (final-normed hidden states, align's `forward_hidden`, the same ones `sequence_rewards` reads): "eos" the
last attended token (the reward model's reading position: each arm's `</s>`), "pre_eos" the token before it (the
answer's last token, the position SFT trained to predict `</s>`), "mean" the mean over the attended tokens. Split:
the rm/dpo stages' (`data.heldout_every`: row % 10 == 0 held out). Each probe: standardised features, L-BFGS on the
mean logistic loss + `wd` ||w||^2, for each `--wd`; train and held-out accuracy (r_c > r_r).

    python bench/rm_probe.py [--runs runs/tiny] [--init sft_checkpoint/final] [--wd 1e-3 1e-2 1e-1] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from align.data.collate import collate  # noqa: E402
from align.data.store import ShardSet  # noqa: E402
from align.stages.pair_data import split_rows  # noqa: E402
from align.stages.ref_cache import tokenizer_hash  # noqa: E402
from align.tokenizer import TokenizerConfig  # noqa: E402
from align.reward.rm_module import critic_from_policy, last_token_index  # noqa: E402

POSITIONS = ("eos", "pre_eos", "mean")


@torch.no_grad()
def pair_features(critic, shards: ShardSet, batch_pairs: int = 64) -> dict[str, torch.Tensor]:
    """{position: (pairs, D) float64 h(chosen) - h(rejected)} over every pair of `shards`."""
    out = {k: [] for k in POSITIONS}
    for lo in range(0, len(shards), batch_pairs):
        batch = collate(shards, np.arange(lo, min(lo + batch_pairs, len(shards))))
        arms = []
        for arm in ("chosen", "rejected"):
            ids, mask = batch[f"{arm}_input_ids"], batch[f"{arm}_attention_mask"]
            hidden = critic.forward_hidden(ids, mask)  # (B, T, D)
            last, rows = last_token_index(mask), torch.arange(ids.shape[0])
            mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            arms.append({"eos": hidden[rows, last], "pre_eos": hidden[rows, last - 1], "mean": mean})
        for k in POSITIONS:
            out[k].append((arms[0][k] - arms[1][k]).double())
    return {k: torch.cat(v) for k, v in out.items()}


def probe(x_train: torch.Tensor, x_held: torch.Tensor, wd: float) -> tuple[float, float]:
    """Logistic regression of "chosen wins" on the pair differences -> (train accuracy, held-out accuracy)."""
    sd = x_train.std(0) + 1e-6
    xt, xh = x_train / sd, x_held / sd
    w = torch.zeros(xt.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.softplus(-(xt @ w)).mean() + wd * w.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float((xt @ w > 0).double().mean()), float((xh @ w > 0).double().mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="runs/tiny")
    ap.add_argument("--init", default="sft_checkpoint/final")
    ap.add_argument("--pairs", default="shards/preference/out")
    ap.add_argument("--heldout-every", type=int, default=10)
    ap.add_argument("--wd", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runs = Path(args.runs)
    shards = ShardSet.open(runs / args.pairs, kind="pairs", tokenizer_hash=tokenizer_hash(TokenizerConfig()))
    critic = critic_from_policy(runs / args.init).eval()
    train, held = (torch.from_numpy(r) for r in split_rows(len(shards), args.heldout_every))
    feats = pair_features(critic, shards)
    result = {"init": args.init, "pairs": len(shards), "heldout": int(held.numel()), "probes": []}
    for k in POSITIONS:
        for wd in args.wd:
            tr, ho = probe(feats[k][train], feats[k][held], wd)
            result["probes"].append({"position": k, "wd": wd, "train_accuracy": round(tr, 4),
                                     "heldout_accuracy": round(ho, 4)})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
