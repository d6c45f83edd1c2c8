"""Process reward model (PRM) training: per-step labels of `StepLabelled` records (align.data.schema, PRM800K's
trajectories via align.data.prm800k) learnt by an align `MistralForProcessReward` (HF MistralForTokenClassification
layout, num_labels 1: one logit per token).

Encoding (`encode_steps`): the conversation through the tokenizer directory's own chat format
(`Tokenizer.encode_chat`: Mistral v0.3 `[INST]`, or the checkpoint's Jinja template), its assistant reply the steps
one per line, so the PRM scores the token sequence a policy writes. A step's label sits on its LAST token: the
position where every token of the step has been read. Step k's end comes from encoding the same conversation with
the reply cut after step k: its last reply token is the one before the turn's closing (the tokens from the last
special token of its assistant span: `</s>`, `<|im_end|>\n`, `<|eot_id|>`), and everything up to it must be a
prefix of the whole encoding, except that the last token may there have taken the line break after the step (Qwen's
and Llama's pre-tokenizers keep ".\n" in one piece: the label sits on that token, which holds the step's end and
none of the next step). Any other BPE merge across a step boundary would make a step's end ambiguous: refused,
naming the step. On the Mistral format this is the reply " " + the steps, then `</s>`, position for position as before.

Labels: rating 1 -> 1, -1 -> 0; the neutral rating 0 is `neutral` = "positive" (PRM800K's convention in Lightman
et al. 2023's binary PRM: a neutral step is not an error), "negative", or "ignore" (no label on that step).

Loss: binary cross-entropy on the logit at each labelled step end, summed over steps; the loss unit is a labelled
step (the TrainModule divides by the window's global step count: the exact mean BCE over the window's steps).
Logged: loss, step accuracy (sigmoid > 0.5 agrees with the label), mean predicted probability, positive share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from align.data.encoding import DEFAULT_DATE_STRING
from align.data.schema import StepLabelled, messages_plain
from align.exceptions import DataError
from align.train.train_module import LossOutput, TrainModule, TrainModuleConfig

IGNORE = -100.0  # step_labels value of an unlabelled position
SUM_KEYS = ("steps", "bce_sum", "correct", "prob_sum", "positives", "rows")


@dataclass(frozen=True)
class PrmLossConfig:
    """[loss] table of a process-reward stage."""

    neutral: Literal["positive", "negative", "ignore"] = "positive"  # the label of a step rated 0
    max_len: int = 512  # tokens per solution; steps ending beyond it lose their label (the row is cut)

    def __post_init__(self):
        if self.neutral not in ("positive", "negative", "ignore"):
            raise ValueError(f"neutral must be 'positive', 'negative' or 'ignore', got {self.neutral!r}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {self.max_len}")


@dataclass(frozen=True)
class EncodedSteps:
    ids: list[int]
    step_ends: list[int]  # position of each labelled step's last token, in step order
    labels: list[float]  # 1.0 / 0.0 per entry of step_ends


def step_label(rating: int, neutral: str) -> float | None:
    if rating == 1:
        return 1.0
    if rating == -1:
        return 0.0
    return {"positive": 1.0, "negative": 0.0, "ignore": None}[neutral]


def encode_steps(tok, record: StepLabelled, cfg: PrmLossConfig) -> EncodedSteps:
    """The record as one token sequence with the end position and label of every labelled step (see module doc)."""
    prompt = messages_plain(record.prompt)
    steps = [s.strip() for s in record.steps]
    ids = _encode_reply(tok, prompt, steps).ids
    ends, labels = [], []
    for k, rating in enumerate(record.ratings):
        cut = _encode_reply(tok, prompt, steps[:k + 1])
        end = _reply_end(tok, cut, record.id) - 1
        if not _same_step_end(tok, ids, cut.ids, end):
            raise DataError(f"record {record.id!r}: step {k} does not end on a token boundary of the whole solution "
                            f"(its tokens merge with the next step's); cannot place its label")
        label = step_label(rating, cfg.neutral)
        if label is not None and end < cfg.max_len:
            ends.append(end)
            labels.append(label)
    return EncodedSteps(ids[:cfg.max_len], ends, labels)


def _encode_reply(tok, prompt: list[dict], steps: list[str]):
    # the date pinned as the shards pin it (a Llama 3.x template would otherwise write the build day)
    return tok.encode_chat(prompt + [{"role": "assistant", "content": "\n".join(steps)}],
                           date_string=DEFAULT_DATE_STRING)


def _same_step_end(tok, ids: list[int], cut: list[int], end: int) -> bool:
    """Whether the whole encoding reads the cut reply's tokens through `end`: the same ids, or the same up to `end`
    and there the step's last characters merged with the newline after them (a byte-level pre-tokenizer keeps
    punctuation and the line break in one piece: ".\n"), so that token holds the step's end and none of the next
    step's text."""
    if ids[:end] != cut[:end] or end >= len(ids):
        return False
    return ids[end] == cut[end] or tok.decode(ids[:end + 1]) == tok.decode(cut[:end + 1]) + "\n"


def _reply_end(tok, enc, record_id: str) -> int:
    """Where the reply's text ends in a one-reply encoding: at the last special token of its assistant span (the
    turn's closing), which must follow at least one reply token."""
    span = [i for i, m in enumerate(enc.loss_mask) if m]
    closing = next((i for i in reversed(span) if tok.is_special(enc.ids[i])), None)
    if closing is None or closing == span[0]:
        raise DataError(f"record {record_id!r}: {tok.source}: the chat format's assistant turn has no closing special "
                        f"token after its text (</s>, <|im_end|>, <|eot_id|>), so a step's last token cannot be "
                        f"placed")
    return closing


def collate_steps(rows: list[EncodedSteps], pad_id: int = 0) -> dict:
    """input_ids (B, T) int64, attention_mask (B, T) bool (right padding), step_labels (B, T) float32: the label at
    each labelled step end, IGNORE elsewhere."""
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.float32)
    for b, row in enumerate(rows):
        ids[b, :len(row.ids)] = torch.tensor(row.ids)
        mask[b, :len(row.ids)] = True
        labels[b, row.step_ends] = torch.tensor(row.labels, dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": mask, "step_labels": labels}


def step_logits(model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) of the batch's labelled step ends, (S,) each; the head runs on those S rows only."""
    dev = model.score.weight.device
    ids, mask, labels = (batch[k].to(dev) for k in ("input_ids", "attention_mask", "step_labels"))
    if model.score.out_features != 1:
        raise ValueError(f"PRM training needs num_labels 1 (one logit per token), the model has "
                         f"{model.score.out_features}")
    hidden = model.forward_hidden(ids, mask)  # (B, T, D)
    sel = labels != IGNORE
    logits = model.score(hidden[sel]).squeeze(-1)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    return logits, labels[sel].to(logits.dtype)


class PrmTrainModule(TrainModule):
    """Per-step BCE on a MistralForProcessReward; the loss unit is a labelled step."""

    def __init__(self, model: nn.Module, cfg: TrainModuleConfig, loss_cfg: PrmLossConfig, total_steps: int,
                 seed: int = 0):
        self.loss_cfg = loss_cfg  # set before super().__init__: wrapping binds self.loss
        super().__init__(model, cfg, total_steps, seed)

    def loss(self, model: nn.Module, batch: dict) -> LossOutput:
        logits, labels = step_logits(model, batch)
        bce = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
        with torch.no_grad():
            prob = torch.sigmoid(logits)
            values = (float(labels.numel()), bce.detach(), ((prob > 0.5).float() == labels).sum(), prob.sum(),
                      labels.sum(), float(batch["input_ids"].shape[0]))
        sums = {k: torch.as_tensor(v, dtype=torch.float32, device=logits.device)
                for k, v in zip(SUM_KEYS, values, strict=True)}
        return LossOutput(loss=bce, sums=sums)

    def loss_units(self, batch: dict) -> float:
        return float((batch["step_labels"] != IGNORE).sum())

    def log_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return prm_metrics(sums)


def prm_metrics(sums: dict[str, float]) -> dict[str, float]:
    steps = sums.get("steps", 0.0)

    def mean(key: str) -> float:
        return sums[key] / steps if steps else float("nan")

    return {"loss": mean("bce_sum"), "steps/accuracy": mean("correct"), "steps/prob": mean("prob_sum"),
            "steps/positive_share": mean("positives"), "steps": steps, "rows": sums.get("rows", 0.0)}


@torch.no_grad()
def prm_eval(model: nn.Module, batches: Iterable[dict]) -> dict[str, float]:
    """Held-out step metrics of a plain PRM (eval mode, no gradients): mean BCE, step accuracy, and the accuracy on
    negative steps alone (a PRM that calls every step right scores the positive share and 0 here)."""
    was_training = model.training
    model.eval()
    n = bce = correct = neg = neg_correct = 0.0
    try:
        for batch in batches:
            logits, labels = step_logits(model, batch)
            pred = (logits > 0).float()
            n += labels.numel()
            bce += float(F.binary_cross_entropy_with_logits(logits, labels, reduction="sum"))
            correct += float((pred == labels).sum())
            neg += float((labels == 0).sum())
            neg_correct += float(((pred == 0) & (labels == 0)).sum())
    finally:
        model.train(was_training)
    return {"steps": n, "loss": bce / n if n else float("nan"), "accuracy": correct / n if n else float("nan"),
            "negative_accuracy": neg_correct / neg if neg else float("nan")}

