"""The final answer of a text that may be a whole solution, the way a grader reads one. In this order:

1. the last box (`\\boxed{...}`, `\\fbox{...}`, `\\boxed 5`), with boxes only separators divide from it joined
   into one list (extract.py);
2. the last final-answer phrase ("the answer is", "Final Answer:", "答案是", "la réponse est", "Ответ:",
   "الإجابة هي", "उत्तर है", ... see _PHRASES): the first math span after it, else the rest of its sentence;
3. the whole text, when it reads as an answer on its own (`5`, `$x = 3$`, `\\[ \\frac12 \\]`);
4. the last math span (`$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`), with spans only separators divide from it
   joined into one list (so "$3$ or $5$" is the hedge `3, 5`, never 5);
5. the last number, when it is the only number of the last sentence and that sentence holds no hedge word.

Every step is one or two linear regex passes over at most VerifyConfig.max_response_chars characters (the tail).
"""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

from align.verify.extract import _SEPARATOR, final_group, find_boxes, join_group
from align.verify.normalize import UNITS, repair_escapes

# Final-answer phrases, case-insensitive. What follows may start with "is", ":", "=", "是", "为" (eaten below).
_POINT_PHRASES = [  # languages that write a decimal point
    # English, GSM8K's marker
    r"####", r"final\s+answer", r"(?:the\s+)?(?:correct\s+)?answer\s+is", r"\banswer\s*[:：]", r"\banswer\s*=",
    # Chinese, Japanese, Korean
    r"最终答案", r"最后答案", r"答案", r"答\s*[:：]", r"答えは", r"答え\s*[:：]", r"解答\s*[:：]", r"정답은", r"답은",
    r"답\s*[:：]",
    # Arabic (its decimal separator ٫ is read as a point), Persian, Hindi
    r"الإجابة\s+النهائية", r"الإجابة\s+هي", r"الجواب\s+هو", r"الإجابة\s*[:：]", r"الجواب\s*[:：]", r"پاسخ\s*[:：]",
    r"अंतिम\s+उत्तर", r"उत्तर\s+है", r"उत्तर\s*[:：=]",
]
_COMMA_PHRASES = [  # languages that write a decimal comma: `2,5` after these is 2.5
    # French, Spanish, Portuguese, Italian, German
    r"r[ée]ponse\s+finale", r"la\s+r[ée]ponse\s+est", r"r[ée]ponse\s*[:：]", r"respuesta\s+final",
    r"la\s+respuesta\s+es", r"respuesta\s*[:：]", r"resposta\s+final", r"a\s+resposta\s+[ée]", r"resposta\s*[:：]",
    r"risposta\s+finale", r"la\s+risposta\s+[èe]", r"risposta\s*[:：]", r"endg[üu]ltige\s+antwort",
    r"die\s+antwort\s+(?:ist|lautet)", r"antwort\s*[:：]",
    # Russian, Ukrainian, Turkish, Vietnamese, Indonesian
    r"окончательный\s+ответ", r"итоговый\s+ответ", r"ответ\s*[:：]", r"ответ\s+(?:равен|—|-)", r"відповідь\s*[:：]",
    r"cevap\s*[:：]", r"yan[ıi]t\s*[:：]", r"đáp\s+án", r"jawaban(?:nya)?\s+(?:adalah|:)",
]
# A dash after the phrase is punctuation only when a space follows it: "the answer is -7" keeps its sign.
_TAIL = r"[ \t*]*(?:is\b|est\b|es\b|ist\b|是|为|為|は|:|：|=|—|-(?=\s))?[ \t*:：]*"
_PHRASE = re.compile("(?i)(?:(?P<point>" + "|".join(_POINT_PHRASES) + ")|(?P<comma>" + "|".join(_COMMA_PHRASES) + "))"
                     + _TAIL)
_COMMA_DECIMAL = re.compile(r"-?[0-9]+,[0-9]+")
_POINT_THOUSANDS_COMMA_DECIMAL = re.compile(r"-?[0-9]{1,3}(?:\.[0-9]{3})+,[0-9]+")  # German `1.234,5`
# The end of the phrase's answer: a line break, or sentence punctuation followed by a space or the end.
_SENTENCE_END = re.compile(r"\n|[.!?](?=\s|$)|[。！？।॥؟]")
_BLANK_LINE = re.compile(r"\n[ \t]*\n")  # TeX ends math mode at a paragraph break: no span holds one
_DELIM = re.compile(r"(?<!\\)\$\$|(?<!\\)\$|\\\(|\\\)|\\\[|\\\]")
_CLOSE = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
# ASCII-only boundaries: "共有57颗" holds the number 57 (CJK letters count as \w in Python's regex). A clock time
# `10:30` or `10:30:00` is one number.
# A fraction `2/3` too. Letters right after a number must be a unit (`12.5m²`, `5cm`), else it is no number (`2x`).
_NUMBER = re.compile(r"(?<![A-Za-z0-9_./])-?(?:[0-9]{1,2}:[0-9]{2}(?::[0-9]{2})?|[0-9]+/[0-9]+|[0-9]+(?:[.,][0-9]+)*)"
                     r"(?![0-9_:/])")
_LETTERS = re.compile(r"[A-Za-z]+")
_PROSE = re.compile(r"[^\W\d_]{3,}")  # a word (any script) between earlier math and the number
# The last of several numbers in the sentence is the answer when the sentence states it: "... which is 1,000.99€".
_STATES = re.compile(r"(?:\bis|'s|\bare|\bequals?|\bwas|\bbe)\s*(?:\\?\$)?\s*$")
# A chat template's turn marker ends the model's answer: what follows is another turn.
_TURN_END = re.compile(r"<\|(?:im_start|im_end|endoftext|end_of_text|eot_id|start_header_id|end_header_id|eos)\|>")
# Other scripts' digits, read as ASCII digits before looking for the last number (one character for one).
_DIGITS = str.maketrans({chr(base + d): str(d) for base in (0x0660, 0x06F0, 0x0966, 0xFF10) for d in range(10)})
# A one-letter assignment right before the number ("The only solution is x = 1."): the number is the value.
_ASSIGNED = re.compile(r"\b[a-zA-Z]\s*=\s*(?=-?[0-9])")
_THINK_END = "</think>"
_HEDGE = re.compile(r"(?i)\b(?:or|either|maybe|perhaps|possibly|probably|approximately|about|around|roughly|ou|o|oder"
                    r"|или|أو|या)\b|或")
_MATHY = re.compile(r"[\\{}^_=<>]")  # a sentence with these is an expression, not prose around one number
_MAX_SPAN = 2_000
_NOT_WORDS = re.compile(r"[^a-zA-Z\s.,!?]")
_TRAILING_PARTICLES = re.compile(r"[\s\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af]+$")  # です, 입니다, 。: not the answer


class Span(NamedTuple):
    start: int
    end: int  # index after the closing delimiter
    content: str


def math_spans(text: str) -> list[Span]:
    """Every closed math span, left to right, in one pass over the delimiters (no backtracking regex)."""
    spans, opener, open_end, open_at = [], None, 0, 0
    for m in _DELIM.finditer(text):
        d = m.group()
        if opener is not None and _BLANK_LINE.search(text, open_end, m.start()):
            opener = None  # the span was broken by a paragraph: TeX would have left math mode there
        if opener is None:
            if d in _CLOSE:
                opener, open_at, open_end = d, m.start(), m.end()
        elif d == _CLOSE[opener]:
            if m.start() - open_end <= _MAX_SPAN:
                spans.append(Span(open_at, m.end(), text[open_end:m.start()]))
            opener = None
    return spans


def _span_group(text: str, spans: list[Span]) -> str:
    return join_group([s.content for s in final_group(text, spans)])


def _after_phrase(text: str) -> str | None:
    last = None
    for last in _PHRASE.finditer(text):
        pass
    if last is None:
        return None
    rest = text[last.end():]
    spans = math_spans(rest[:_MAX_SPAN * 2])
    if spans and not rest[:spans[0].start].strip(" \t*"):
        return join_group([s.content for s in _adjacent(rest, spans)])
    end = _SENTENCE_END.search(rest)
    answer = _TRAILING_PARTICLES.sub("", rest if end is None else rest[:end.start()]).strip(" \t*")
    if last.group("comma") and _COMMA_DECIMAL.fullmatch(answer):
        answer = answer.replace(",", ".")
    elif last.group("comma") and _POINT_THOUSANDS_COMMA_DECIMAL.fullmatch(answer):
        answer = answer.replace(".", "").replace(",", ".")
    return answer or None


def _adjacent(text: str, spans: list[Span]) -> list[Span]:
    """The first span and the spans right after it that only separators divide from it."""
    out = [spans[0]]
    for s in spans[1:]:
        if not _SEPARATOR.fullmatch(text, out[-1].end, s.start):
            break
        out.append(s)
    return out


def _numbers(text: str) -> list[re.Match]:
    out = []
    for m in _NUMBER.finditer(text):
        unit = _LETTERS.match(text, m.end())
        if unit is None or unit.group().lower() in UNITS:
            out.append(m)
    return out


def _last_number(text: str) -> str | None:
    """The last number, when it is the only number of its sentence (or the one the sentence states: "which is 7")
    and the sentence holds no hedge word and no math."""
    found = _last_number_at(text)
    return None if found is None else found[0]


def _last_number_at(text: str) -> tuple[str, int] | None:
    text = text.translate(_DIGITS)
    numbers = _numbers(text)
    if not numbers:
        return None
    last = numbers[-1]
    start = 0
    for m in _SENTENCE_END.finditer(text, 0, last.start()):
        start = m.end()
    sentence = text[start:]
    end = _SENTENCE_END.search(sentence, last.end() - start)
    sentence = sentence if end is None else sentence[:end.start()]
    before = text[max(start, last.start() - 200):last.start()]
    if _HEDGE.search(sentence):
        return None
    sentence = _ASSIGNED.sub("", sentence.replace("\\$", ""))
    maths = list(_MATHY.finditer(sentence))
    if maths:  # math earlier in the sentence: only prose after it may state the number ("= 2/3 So it is 2/3")
        sentence = sentence[maths[-1].end():]
        if not _PROSE.search(sentence[:sentence.rfind(last.group())]):
            return None
    count = len(_numbers(sentence))
    if count == 0 or (count > 1 and not _STATES.search(before)):
        return None
    return last.group(), last.start()


class Extraction(NamedTuple):
    answer: str | None  # the final answer's text; several adjacent boxes (or spans) are joined as the list `a, b`
    boxes: int  # how many boxes the (truncated) response holds
    source: str  # box | phrase | whole | span | number | none


def extract(response: str, max_chars: int, fallback: bool = False,
            readable: Callable[[str], bool] | None = None) -> Extraction:
    """The final answer of `response` (its last `max_chars` characters): its last box group; with `fallback`, when
    there is no box, steps 2-5 of the module docstring (step 3 only when `readable` is given)."""
    text = repair_escapes(response[-max_chars:] if len(response) > max_chars else response)
    if "<|" in text:
        turn_end = _TURN_END.search(text)
        text = text if turn_end is None else text[:turn_end.start()]
    boxes = find_boxes(text) if "box" in text else []
    if boxes:
        group = final_group(text, boxes)
        if any(b.content is None or not b.content.strip() for b in group):
            return Extraction(None, len(boxes), "box")
        return Extraction(join_group([b.content for b in group]), len(boxes), "box")
    if not fallback:
        return Extraction(None, 0, "none")
    if _THINK_END in text:  # a reasoning model's scratch work is not its answer; what follows the block is
        after = text[text.rindex(_THINK_END) + len(_THINK_END):]
        text = after if after.strip() else text
    answer, source = _unboxed_answer(text, readable)
    return Extraction(answer, 0, source)


def _answer_shaped(text: str, spans: list[Span]) -> bool:
    """Could the whole text be one answer? Not prose around math (`So $x = 25$.`: math delimiters inside it) and not
    a sentence of words (`So we get tuesday`: a word answer has at most 4 words)."""
    body = text.strip()
    if not body:
        return False
    lead = len(text) - len(text.lstrip())
    whole_span = len(spans) == 1 and spans[0].start == lead and spans[0].end == len(text.rstrip())
    if spans and not whole_span:
        return False
    if not spans and _DELIM.search(body):
        return False
    return bool(_NOT_WORDS.search(body)) or len(body.split()) <= 4


def _unboxed_answer(text: str, readable: Callable[[str], bool] | None) -> tuple[str | None, str]:
    found = _after_phrase(text)
    if found is not None:
        if readable is not None and not readable(found):
            # "Final Answer: The largest n is 12.": a sentence after the phrase, whose one number is the answer
            number = _last_number(found)
            if number is not None:
                return number, "phrase"
        return found, "phrase"
    spans = math_spans(text)
    if readable is not None and _answer_shaped(text, spans) and readable(text):
        return text, "whole"
    number = _last_number_at(text)
    # the last math span, unless a stated number comes after it ("... $d = 90/n$. So there are 12 sequences.")
    if spans and (number is None or number[1] < spans[-1].end or _DELIM.search(text, spans[-1].end, number[1])):
        return _span_group(text, spans), "span"
    if number is not None:
        return number[0], "number"
    return None, "none"
