"""How often the verifier (align.verify) agrees with a dataset's own final-answer labels.

PRM800K's labelers rated the last step of every finished solution, `# Answer\\n\\n<answer>`: 1 when the final answer
is right, -1 when it is wrong. Comparing that answer with the problem's ground truth through the verifier gives a
second verdict; their agreement measures the verifier on real model answers in MATH's notation (a disagreement is a
verifier false negative or positive, or a labeling error: `disagreements` lists the first ones to read).

Counted: a record whose last step is an answer rated 1 or -1. Not counted, and reported: no answer step (the walk
ended at an earlier error or the labeler gave up), an answer rated 0, a gold the verifier cannot read."""

from __future__ import annotations

from typing import Iterable

from align.data.prm800k import final_answer
from align.data.schema import StepLabelled
from align.verify import compare
from align.verify.config import DEFAULT_CONFIG, VerifyConfig

MAX_LISTED = 20


def outcome_agreement(records: Iterable[StepLabelled], config: VerifyConfig = DEFAULT_CONFIG) -> dict:
    """Counts of (dataset label, verifier verdict) and their agreement rate; see the module docstring."""
    cells = {"label_right_verifier_right": 0, "label_right_verifier_wrong": 0, "label_wrong_verifier_right": 0,
             "label_wrong_verifier_wrong": 0}
    skipped = {"no_answer_step": 0, "answer_rated_neutral": 0, "gold_unreadable": 0}
    prediction_unreadable, disagreements = 0, []
    for record in records:
        answer = final_answer(record.steps)
        if answer is None:
            skipped["no_answer_step"] += 1
            continue
        if record.ratings[-1] == 0:
            skipped["answer_rated_neutral"] += 1
            continue
        same, reason = compare(record.gold, answer, config)
        if same is None:
            skipped["gold_unreadable"] += 1
            continue
        prediction_unreadable += reason.startswith("prediction unreadable")
        label = "right" if record.ratings[-1] == 1 else "wrong"
        cells[f"label_{label}_verifier_{'right' if same else 'wrong'}"] += 1
        if (label == "right") != same and len(disagreements) < MAX_LISTED:
            disagreements.append({"id": record.id, "gold": record.gold, "answer": answer, "label": label,
                                  "verifier": reason})
    compared = sum(cells.values())
    agree = cells["label_right_verifier_right"] + cells["label_wrong_verifier_wrong"]
    return {"compared": compared, "agreement": agree / compared if compared else None, **cells,
            "prediction_unreadable": prediction_unreadable, **skipped, "disagreements": disagreements}
