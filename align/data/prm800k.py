"""PRM800K (openai/prm800k, `phase{1,2}_{train,test}.jsonl`): step-level human ratings -> step-labelled records
(kind "steps", what a process reward model learns) or step-level preference pairs (kind "pairs").

One row of the published layout is one labelled solution attempt:

    {"question": {"problem", "ground_truth_answer", ...},
     "label": {"steps": [{"completions": [{"text", "rating": -1 | 0 | 1 | null, "flagged"}, ...],
                          "human_completion": {"text", ...} | null, "chosen_completion": int | null}, ...],
               "finish_reason": "solution" | "found_error" | "give_up" | "flagged_bad_problem" | "bad_problem"}}

The solution a labeler walked is, step by step, the completion at `chosen_completion`, else the labeler's own
`human_completion` (rated 1: a human wrote it as a correct step). A step with neither is where the walk ended: on
"found_error" the trajectory ends with that step's first completion rated -1 (the error found), otherwise it ends
before it. The last step of a finished solution is `# Answer\n\n<final answer>`; its rating is the dataset's own
verdict on the final answer (align.data.outcome_agreement compares the verifier with it).

Pairs: at every step where the labeler rated alternatives, the first completion rated 1 against each one rated -1,
both after the same prefix of chosen steps (prompt = the problem; chosen / rejected = prefix + that step, one step
per line). A row with no such step yields no pair (counted by ingest as a row without records)."""

from __future__ import annotations

from align.data.schema import Message, PreferencePair, Record, RowError, StepLabelled

ANSWER_PREFIX = "# Answer"


def _rating(step: int, k: int, completion: object) -> int | None:
    if not isinstance(completion, dict) or not isinstance(completion.get("text"), str):
        raise RowError(f"label.steps[{step}].completions[{k}]", "expected an object with a string text")
    rating = completion.get("rating")
    if rating is not None and (isinstance(rating, bool) or rating not in (-1, 0, 1)):
        raise RowError(f"label.steps[{step}].completions[{k}].rating", f"expected -1, 0, 1 or null, got {rating!r}")
    return rating


def _steps(label: dict) -> list[dict]:
    steps = label.get("steps")
    if not isinstance(steps, list) or not steps:
        raise RowError("label.steps", "expected a non-empty list of steps")
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("completions"), list):
            raise RowError(f"label.steps[{i}]", "expected an object with a completions list")
        for k, completion in enumerate(step["completions"]):
            _rating(i, k, completion)
    return steps


def _taken(i: int, step: dict, finish: str) -> tuple[str, int] | None:
    """(text, rating) of the completion the walk took at step i, or None when the walk ended before it."""
    chosen, completions = step.get("chosen_completion"), step["completions"]
    if chosen is not None:
        if not isinstance(chosen, int) or not 0 <= chosen < len(completions):
            raise RowError(f"label.steps[{i}].chosen_completion", f"{chosen!r} is not an index of its "
                                                                  f"{len(completions)} completions")
        taken = completions[chosen]
        if taken.get("rating") is None:
            raise RowError(f"label.steps[{i}].completions[{chosen}].rating", "the chosen completion is unrated")
        return taken["text"], taken["rating"]
    human = step.get("human_completion")
    if isinstance(human, dict) and isinstance(human.get("text"), str):
        return human["text"], 1
    if finish == "found_error":
        bad = next((c for c in completions if c.get("rating") == -1), None)
        if bad is not None:
            return bad["text"], -1
    return None


def trajectory(label: dict) -> tuple[list[str], list[int]]:
    """The steps a labeler walked and their ratings (see the module docstring)."""
    finish = label.get("finish_reason")
    texts, ratings = [], []
    for i, step in enumerate(_steps(label)):
        taken = _taken(i, step, finish)
        if taken is None:
            break
        texts.append(taken[0])
        ratings.append(taken[1])
        if taken[1] == -1 and step.get("chosen_completion") is None:
            break  # the error the labeler stopped at
    if not texts:
        raise RowError("label.steps", "no step was taken (no chosen, human or error completion at step 0)")
    return texts, ratings


def final_answer(steps: tuple[str, ...] | list[str]) -> str | None:
    """The final answer written by a finished solution's last step (`# Answer\\n\\n12` -> `12`), else None."""
    if not steps or not steps[-1].lstrip().startswith(ANSWER_PREFIX):
        return None
    answer = steps[-1].lstrip()[len(ANSWER_PREFIX):].strip()
    return answer or None


def _pairs(problem: str, label: dict, rid: str, group: str) -> list[PreferencePair]:
    prompt = (Message("user", problem),)
    prefix, pairs = [], []
    finish = label.get("finish_reason")
    for i, step in enumerate(_steps(label)):
        good = next((c["text"] for c in step["completions"] if c.get("rating") == 1), None)
        bad = [c["text"] for c in step["completions"] if c.get("rating") == -1]
        for k, text in enumerate(dict.fromkeys(bad)):  # each distinct wrong step once
            if good is not None and text != good:
                pairs.append(PreferencePair(f"{rid}-s{i}-{k}", prompt, "\n".join(prefix + [good]),
                                            "\n".join(prefix + [text]), group))
        taken = _taken(i, step, finish)
        if taken is None or taken[1] == -1:
            break  # no correct prefix continues past an error
        prefix.append(taken[0])
    return pairs


def prm800k_records(kind: str, row: dict, rid: str, group: str) -> list[Record]:
    question, label = row["question"], row["label"]
    problem, gold = question.get("problem"), question.get("ground_truth_answer")
    if not isinstance(problem, str) or not problem.strip():
        raise RowError("question.problem", "expected a non-empty string")
    if not isinstance(gold, str) or not gold.strip():
        raise RowError("question.ground_truth_answer", "expected a non-empty string")
    if kind == "pairs":
        return _pairs(problem, label, rid, group)
    texts, ratings = trajectory(label)
    return [StepLabelled(rid, (Message("user", problem),), tuple(texts), tuple(ratings), gold.strip(), group)]
