"""A deterministic corpus of texts that stress a tokenizer (the oracle tests compare every text, both directions).

Categories: English, code, LaTeX, emoji and ZWJ sequences, CJK, Arabic/Hebrew, Devanagari and other Indic,
combining marks, control characters, whitespace runs, tabs/newlines, the empty string, very long strings, and
strings that spell special tokens. Then seeded random mixtures of all of them and random code points.
"""

from __future__ import annotations

import random

ENGLISH = [
    "Hello world", "hello world", "Hello, World!", "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune...",
    "Don't you think they'll've finished by 5 o'clock? I'm sure we'd know.",
    "U.S.A. e.g. i.e. etc. Mr. Smith vs. Mrs. Jones", "ALL CAPS SENTENCE WITH NUMBERS 12345 AND 3.14159",
    "camelCaseWords snake_case_words kebab-case-words PascalCase", "email: someone@example.com, url: https://x.org/a?b=c",
    "1 + 1 = 2; 2 * 3 = 6; 10 / 4 = 2.5; 2^10 = 1024", "$1,234.56 costs 15% more than €1.000,00",
    "Q: What is 17 times 23?\nA: 17 * 23 = 391. The answer is 391.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism", "a", "I", "A B C", "ok.", "?!",
    "\"quoted\" 'single' «guillemets» „German“ ‘curly’", "—em dash– en dash - hyphen … ellipsis",
    "Mistral's tokenizer splits words like 'tokenization' into pieces.", "#hashtag @mention &amp; <b>bold</b>",
]

CODE = [
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n", "SELECT id, name FROM users WHERE age > 30;",
    "const add = (a, b) => a + b;\nconsole.log(add(1, 2));", '{"key": [1, 2, {"nested": null}], "b": true}',
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done",
    "class Foo(Bar):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self):\n        super().__init__()\n",
    "if x != y && !(a || b) { return -1; } else if (p->q >= 0) { *ptr++ = 0; }",
    "<html>\n  <body>\n    <div class=\"x\">Hi</div>\n  </body>\n</html>", "fn main() { println!(\"{}\", 1u64 << 40); }",
    "    indented four\n        indented eight\n\t\ttabbed twice", "x=1;y=2;z=x+y", "a[0][1]->b.c::d",
    "// comment\n/* block\n comment */\n# hash comment", "lambda: (yield from range(10))",
    "diff --git a/x b/x\n@@ -1,3 +1,3 @@\n-old line\n+new line\n", "0x1F 0b1010 0o17 1e-9 -3.5E+10 1_000_000",
]

LATEX = [
    r"\frac{a}{b} + \sqrt{x^2 + y^2}", r"$$\int_0^\infty e^{-x^2}\,dx = \frac{\sqrt{\pi}}{2}$$",
    r"\begin{align} a &= b \\ c &= d \end{align}", r"\boxed{\frac{1}{2}}", r"$\sum_{i=1}^{n} i = \frac{n(n+1)}{2}$",
    r"\mathbb{R}^n \to \mathcal{L}(V, W)", r"\left( \frac{\partial f}{\partial x} \right)_{y}",
    r"The answer is $\boxed{42}$.", r"\alpha\beta\gamma\delta \Gamma \Omega", r"x_{i,j}^{(k)} \leq \epsilon",
]

EMOJI = [
    "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "👩🏾‍💻 writes code", "🏳️‍🌈", "🇫🇷🇯🇵🇺🇸", "1️⃣2️⃣#️⃣", "❤️ vs ❤", "🧑‍🤝‍🧑",
    "I ❤️ NY 🗽!", "🙂🙃🙂🙃", "🫠🫥🫨", "a😀b😀c", "✌🏻✌🏼✌🏽✌🏾✌🏿", "👁️‍🗨️", "🐕‍🦺 🐈‍⬛",
]

CJK = [
    "日本語のテキストです。", "中文文本，包括标点符号。", "한국어 텍스트입니다.", "東京は日本の首都です",
    "ひらがな カタカナ 漢字", "全角ＡＢＣ１２３", "我爱自然语言处理", "こんにちは、世界！", "𠀀𠀁𪚥 (CJK Ext B)",
    "中文 English 混合 text", "｢半角｣・ｶﾀｶﾅ", "一二三四五六七八九十",
]

RTL_INDIC = [
    "مرحبا بالعالم", "اللُّغَةُ الْعَرَبِيَّةُ", "שלום עולם", "123 مرحبا abc", "\u200fمرحبا\u200e",
    "नमस्ते दुनिया", "हिन्दी भाषा में पाठ।", "क्षत्रिय ज्ञान", "தமிழ் மொழி", "ภาษาไทยไม่มีช่องว่าง",
    "বাংলা ভাষা", "ગુજરાતી", "ᚠᚢᚦᚨᚱᚲ", "Ελληνικά κείμενα", "Русский текст с ё", "Ge'ez: ሰላም",
]

COMBINING = [
    "e\u0301", "caf\u00e9 vs cafe\u0301", "n\u0303", "a\u0300\u0301\u0302\u0303\u0304", "Z\u0351\u0352\u0353\u0354\u0355alg\u0336o",
    "\u0301 leading combining", "x\u20dd", "Ǆ ǅ ǆ", "ﬁ ﬂ ﬀ", "Å Å Å", "ḱṷṓn", "\u0e01\u0e34\u0e4a",
]

CONTROL = [
    "\x00", "a\x00b", "\x01\x02\x03", "\x07bell", "\x1b[31mred\x1b[0m", "\x7f", "\x85", "\x1c\x1d\x1e\x1f",
    "zero\u200bwidth", "joiner\u200dhere", "\ufeffBOM", "\u2028line\u2029para", "soft\u00adhyphen",
    "\ufff9\ufffa\ufffb", "\U000e0001\U000e0041", "\ue000 private \U000f0000", "\ufffd replacement", "\uffff\ufffe",
]

WHITESPACE = [
    " ", "  ", "   ", " " * 16, " leading", "trailing ", "  both  ", "a  b   c    d", "\t", "\t\t\tx", "\n",
    "\n\n\n", "a\nb\nc", "line1\r\nline2\r\n", "\r", "tab\there", " \t \n \r ", "\u00a0nbsp\u00a0", "\u3000ideo",
    "\u2003em\u2009thin\u200ahair", "x" + " " * 50 + "y", "\n" * 20 + "z", "end\n", "   \n   \n",
]

SPECIAL_TEXT = [
    "<s>", "</s>", "<unk>", "[INST]", "[/INST]", "<s>[INST] hi[/INST] yes</s>", "[INST] What? [/INST]",
    "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[REFERENCE_DOC_0]", "[REFERENCE_DOC_19] and [REFERENCE_DOC_1]",
    "x[REFERENCE_DOC_7]y", "[INST", "INST]", "<<s>>", "</s></s>", "<s> <s>", "[control_8]", "[control_746]",
    "<0x41>", "<0x0A>", "\u2581", "\u2581\u2581x", "a\u2581b", "text <s> inside", "[/INST][INST]", "<s\n>",
    "[REFERENCE_DOC_1][INST]", "[REFERENCE_DOC_2]<s>", "[REFERENCE_DOC_3]</s>[REFERENCE_DOC_4]",
    "<|endoftext|>", "<|im_start|>user", "[IMG]", "[PREFIX]", "[MIDDLE]",
]

EMPTY = ["", " ", "0", ".", "\n"]

_FRAGMENTS = ENGLISH + CODE + LATEX + EMOJI + CJK + RTL_INDIC + COMBINING + CONTROL + WHITESPACE + SPECIAL_TEXT

# Blocks assigned long ago (Unicode <= 13), so Python's unicodedata and Oniguruma agree on their categories.
_BLOCKS = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF),
           (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x21FF),
           (0x2200, 0x22FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
           (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x20000, 0x2A6DF), (0x0, 0x1F)]


def random_codepoint_text(rng: random.Random, length: int) -> str:
    out = []
    for _ in range(length):
        lo, hi = rng.choice(_BLOCKS)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def long_texts() -> list[str]:
    rng = random.Random(7)
    letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10_000))
    prose = " ".join(ENGLISH) * 8
    return [
        "a" * 10_000, letters, " " * 5_000, "\n" * 3_000, "\t" * 2_000 + "x", "😀" * 2_000, "日本" * 3_000,
        prose, "\n".join(CODE) * 10, "x" + " " * 9_999, "ab" * 5_000, "[INST]" * 500,
        random_codepoint_text(rng, 20_000),
    ]


def build_corpus(n_random: int = 260, seed: int = 0) -> list[str]:
    """All hand-written texts, the long ones, then seeded random mixtures (>= 400 texts in total)."""
    rng = random.Random(seed)
    texts = _FRAGMENTS + EMPTY + long_texts()
    for _ in range(n_random // 2):
        k = rng.randint(2, 6)
        texts.append(rng.choice(["", " ", "\n", "\t"]).join(rng.choice(_FRAGMENTS) for _ in range(k)))
    for _ in range(n_random // 2):
        texts.append(random_codepoint_text(rng, rng.randint(1, 80)))
    return texts
