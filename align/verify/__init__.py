"""Math answer verification: exact, bounded, pure stdlib, never `eval`. See docs/ARCHITECTURE.md (## verify).

    are_equivalent(gold, pred) -> True | False | None   (None: the gold itself cannot be read)
    compare(gold, pred) -> (verdict, reason);  compare_answers(gold_answer, pred_answer): the same, no extraction
    answer_of(text) -> str | None;  is_readable(answer) -> bool;  extract_answer(response, fallback=False)

Either side may be a bare answer, `$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`, a boxed answer or a whole solution
text. The final answer is found in this order (response.py): the last box (adjacent boxes: one list); the last
final-answer phrase ("the answer is", "Final Answer:", "####", 答案是, 答：, 答えは, 정답은, la réponse est,
la respuesta es, a resposta é, la risposta è, die Antwort ist, Ответ:, Відповідь:, الإجابة هي, الجواب هو,
उत्तर है, अंतिम उत्तर, Cevap:, Đáp án, Jawabannya adalah, پاسخ:) and the math span or sentence after it; the whole
text when it reads as one answer; the last math span (adjacent spans: one list); the last number when it is the
only number of its sentence (or the one the sentence states: "which is 1,000.99€") and no hedge word is near; a
stated number after the last math span wins over it. Without a box, the text after a `</think>` block is read, and a
chat turn marker (`<|im_start|>`) ends the response. The GRPO reward (align/eval/verifier.py) reads only
boxes (its format rule) and then calls compare_answers: the comparison is the same code.

What it reads, with an example of each form (gold ~ pred, both True):
    numbers       `1000` ~ `1,000`, `1 000`, `1\\,000`, `10{,}000` (thousands); `1.22` ~ `1,22`, "La réponse est 2,5"
                  (decimal comma: two digits after it, or after a decimal-comma language's phrase); `٤٢`, `४२` (digits)
    fractions     `\\frac{1}{2}` ~ `\\dfrac12`, `\\tfrac{1}{2}`, `1/2`, `0.5`; `0.\\overline{3}` ~ `\\frac13`
    mixed         `9999 \\frac{6}{7}` ~ `\\frac{69999}{7}`; `2 1/2` ~ `2.5`
    roots         `2\\sqrt2` ~ `\\sqrt{8}`; `\\sqrt[3]{x}^2` ~ `x^{2/3}`; `\\frac{\\sqrt2}{2}` ~ `\\frac{1}{\\sqrt2}`;
                  `\\sqrt{x}^3` ~ `x\\sqrt{x}`
    complex       `2i` ~ `(1+i)^2`, `\\sqrt{-4}`; `5` ~ `|3+4i|`, `(2+i)(2-i)` (the variable i is the imaginary unit)
    polynomials   `x^2+7x+10` ~ `(x+2)(x+5)`; `\\frac{x+1}{x^2-1}` ~ `\\frac{1}{x-1}` (exact rational functions)
    constants     `\\frac{\\pi}{4}` ~ `\\pi/4`; `e^2`; `\\infty`; a gold decimal of >= 3 digits accepts what rounds
                  to it
    scientific    `1.5 \\times 10^{3}` ~ `1500`, `1.5e3`
    percent       `25\\%` ~ `25`, `0.25`, `\\frac14` (VerifyConfig.percent)
    units         `18` ~ `\\$18`, `18 €`, `18 dollars`; `12` ~ `12 m²`, `12\\text{ cm}^2`, `12^\\circ C`
                  (VerifyConfig.units="match": the gold's unit must be there: `5\\text{ cm}` is not `5 m`)
    degrees       `30^\\circ` ~ `30`, `\\frac{\\pi}{6}`; `\\frac{\\pi}{6}` ~ `30^\\circ`
                  (but not `30`: the gold says radians)
    base n        `204_5` ~ `204_{5}`, `204` (the digits the question asked for); not `54`
    matrices      `\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}` ~ the same in `bmatrix` / `array`, entry by entry;
                  a one-column or one-row matrix ~ the tuple `(1, 2)`
    intervals     `(-\\infty, 3]` ~ `x \\le 3`; `[-2, 7]` ~ `x \\in [-2, 7]`, `-2 \\le x \\le 7`; unions in any order;
                  `(-\\infty,-1) \\cup (2,\\infty)` ~ `x < -1 \\text{ or } x > 2`;
                  `\\mathbb{R}` ~ `\\text{all real numbers}`;
                  `(-\\infty, 1) \\cup [1, 2]` ~ `(-\\infty, 2]` (touching parts merged);
                  `x \\ne -2` ~ `(-\\infty,-2)\\cup(-2,\\infty)`
    inequalities  solution sets: `x < 1` ~ `-x > -1`, `2x + 1 \\le 7` ~ `x \\le 3`, `-1 \\le 2x+1 < 3` ~ `[-1, 1)`
    equations     `y = 2x + 1` ~ `2x + 1` (VerifyConfig.assignment_is_value), `2y = 4x + 2`, `1 + 2x = y`;
                  `f(x) = 3x` ~ `3x`
    lists, sets   `10, 4, -2` is ordered (not `4, 10, -2`) unless the gold is a set `\\{10, 4, -2\\}` or
                  VerifyConfig.unordered_lists; `1 \\pm \\sqrt2` ~ `1-\\sqrt2, 1+\\sqrt2`; `\\emptyset` ~ `\\varnothing`
    tuples        `(1, 2)` ~ `\\left(1,2\\right)`, `\\langle 1, 2 \\rangle`; `(1, 2)` is also the open interval
    text          `\\text{Evelyn}` ~ `Evelyn`, `\\textbf{evelyn}`; `\\text{(C)}` ~ `C`
    prose         "所以她总共有57颗。" ~ 57; "Final Answer: The largest n is 12." ~ 12; "Therefore the answer is -7"
    decimals      `\\frac13` ~ `0.3333`, `\\sqrt{10}` ~ `3.1622776601683795` (VerifyConfig.decimal_min_sig_digits,
                  off in REWARD_CONFIG, the GRPO reward's default); `\\frac18` needs 0.125
    approximation `x = 1/4 \\approx 0.25` ~ `\\frac14`, `0.25` (refused when the two parts disagree);
                  `2x + 1 = 15 \\Rightarrow x = 7` ~ 7
    identities    `\\cot^2 x + 1` ~ `\\csc^2 x`; `\\sin 2x` ~ `2 \\sin x \\cos x`;
                  `\\frac{2}{\\sqrt x}` ~ `\\frac{2\\sqrt x}{x}`
    labels        `(4,1)` ~ `(a,b)=(4,1)`; `3, 8` ~ `XY=3, ZW=8`; `2` ~ `|PQ|=2`; `5:9` ~ `S_1:S_2=5:9`, `10:18`;
                  `(3,2),(5,2)` ~ `p=3,q=2;p=5,q=2`; `6` ~ `\\text{Area} = 6`
    several       `(2,9),(9,2)` ~ `(9,2), (2,9)` (a list of tuples is a set of solutions); `1, 2, 3` ~ `1; 2; 3`
    sets          `(0,2)` ~ `0<g(x)<2`; `[-3,-2] \\cup [2,3]` ~ `2 \\le |w| \\le 3`; `(-3,3)` ~ `|x|<3`
    times, sums   `10:30` ~ `10:30:00`; `55` ~ `\\sum_{k=1}^{10} k`; `\\frac{n(n+1)}{2}` ~ `\\sum_{k=1}^n k`;
                  `\\sum_{k=1}^n k^2` ~ `\\sum_{i=1}^n i^2`
    layout        doubled backslashes (`\\\\frac`), a form feed for `\\f` (`"\\frac"` in a Python string), `12\\\\`,
                  `\\mathbf{...}`, `\\textcolor{red}{4}`, `\\hspace{1mm}`, `3\\pi cm` ~ `3\\pi`;
                  matrix sums and products;
                  `\\begin{cases} x=2 \\\\ y=3 \\end{cases}` ~ `(2, 3)`

What it refuses (False for a prediction, None for a gold): hedges (`5 \\text{ or } 7`, two different boxes, "5 or 7",
`5 \\text{ maybe}`, an inequality or interval where a number is asked, `\\{5, 7\\}` for 5); false equations
(`2 + 2 = 5`, `x = 7 = 11`); a math span broken by a blank line; a list ending in `...`; number words
(`4 \\text{ thousand}`); unclosed or empty boxes; unknown commands and environments;
look-alike digits (`𝟓`); anything over a bound of VerifyConfig (characters, nesting, steps, bits, digits, terms):
`10^{10^{10}}`, 10,000 nested braces, a 100k-character answer, a 5,000-entry matrix. Bounds are counts, never
timers, so a call costs the same in any thread or process.
"""

from __future__ import annotations

from align.verify.answer import make_budget, read_answer, unbox
from align.verify.config import DEFAULT_CONFIG, VerifyConfig
from align.verify.equiv import values_equal
from align.verify.limits import Unreadable
from align.verify.response import Extraction, extract
from align.verify.units import unit_of

__all__ = ["VerifyConfig", "DEFAULT_CONFIG", "Unreadable", "Extraction", "are_equivalent", "is_readable",
           "extract_answer", "extract", "read_answer", "compare", "compare_answers", "answer_of", "why_unreadable"]


def answer_of(text: str, config: VerifyConfig = DEFAULT_CONFIG) -> str | None:
    """The final answer of a bare answer, a math span, a boxed answer or a whole solution text (response.py)."""
    return extract(text, config.max_response_chars, True, lambda s: why_unreadable(s, config) is None).answer


def compare(gold: str, pred: str, config: VerifyConfig = DEFAULT_CONFIG) -> tuple[bool | None, str]:
    """(verdict, reason): verdict None when the gold is unreadable, False when the prediction is; reason says why.
    Either side may be an answer or a whole response: its final answer is taken first (answer_of)."""
    # Where no step finds an answer, the text itself is read, so the reason says what in it cannot be read.
    g, p = answer_of(gold, config), answer_of(pred, config)
    return compare_answers(gold if g is None else g, pred if p is None else p, config)


def compare_answers(gold: str, pred: str, config: VerifyConfig = DEFAULT_CONFIG) -> tuple[bool | None, str]:
    """compare() on two already extracted answers (the GRPO reward extracts with its own, stricter, rule)."""
    try:
        g = read_answer(unbox(gold), config)
    except Unreadable as e:
        return None, f"gold unreadable ({type(e).__name__}: {e})"
    try:
        p = read_answer(unbox(pred), config)
    except Unreadable as e:
        return False, f"prediction unreadable ({type(e).__name__}: {e})"
    if config.units == "match" and unit_of(gold) and unit_of(gold) != unit_of(pred):
        return False, f"units differ ({unit_of(gold)!r} asked, {unit_of(pred) or 'none'!r} given)"
    try:
        same = values_equal(g, p, config, make_budget(config, compare=True))
    except Unreadable as e:  # the comparison itself went over budget (huge cross-multiplication)
        return False, f"comparison refused ({e})"
    return same, "equal" if same else "different"


def are_equivalent(gold: str, pred: str, config: VerifyConfig = DEFAULT_CONFIG) -> bool | None:
    """Does `pred` match `gold` (answers or whole responses)? None when `gold` cannot be read (never 1)."""
    return compare(gold, pred, config)[0]


def why_unreadable(text: str, config: VerifyConfig = DEFAULT_CONFIG) -> str | None:
    """None when this answer string (or boxed answer) can be checked, else the reason it cannot."""
    try:
        read_answer(unbox(text), config)
        return None
    except Unreadable as e:
        return f"{type(e).__name__}: {e}"


def is_readable(text: str, config: VerifyConfig = DEFAULT_CONFIG) -> bool:
    """Can this answer string (or a boxed answer) be checked at all?"""
    return why_unreadable(text, config) is None


def extract_answer(response: str, fallback: bool = False, config: VerifyConfig = DEFAULT_CONFIG) -> str | None:
    """The text of the response's final answer (adjacent boxes joined as a set), or None when there is none."""
    return extract(response, config.max_response_chars, fallback).answer
