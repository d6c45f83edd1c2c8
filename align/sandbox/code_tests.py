"""Tests as a reward: a completion's Python program against a test file, run in the sandbox (align.sandbox.run).

The program is the completion's last fenced block (```python, ```py or a bare ```), or the whole completion with
`extract = "whole"`. The tests are a row's test code (e.g. MBPP's asserts one per line, or HumanEval's `check`
function and a call of it): every top-level `assert` and expression statement is one test, every other statement
(imports, definitions, assignments) is setup, run in order in the program's namespace. A test passes when it runs
to its end without an exception, after the program ran without one.

    reward = passed / tests        ("fraction")
           = 1 if all passed else 0 ("all")
A completion without a program gets 0 (status "no_program"); a test file that does not parse, or holds no test,
is the row's fault, not the sample's: `TestFileError` (the reward term marks the sample invalid, as the verifier
does with a gold answer it cannot read)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from align.sandbox.run import SandboxConfig, SandboxResult, run_python

FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


class TestFileError(ValueError):
    """The row's test code cannot serve as tests."""

    __test__ = False  # not a pytest class


@dataclass(frozen=True)
class CodeVerdict:
    reward: float
    status: str  # passed | failed | partial | no_program | program_error | timeout
    result: SandboxResult | None


def extract_program(completion: str, extract: str = "fenced") -> str | None:
    """The last fenced code block, or the whole text (`extract = "whole"`); None when there is none."""
    if extract == "whole":
        return completion if completion.strip() else None
    blocks = FENCE.findall(completion)
    return blocks[-1] if blocks and blocks[-1].strip() else None


def split_tests(test_code: str) -> list[tuple[str, str]]:
    """[(kind, source)]: top-level asserts and expressions are "test", every other statement "setup"."""
    try:
        tree = ast.parse(test_code)
    except SyntaxError as exc:
        raise TestFileError(f"test code does not parse: {exc.msg} (line {exc.lineno})") from None
    steps = [("test" if isinstance(node, (ast.Assert, ast.Expr)) else "setup",
              ast.get_source_segment(test_code, node, padded=False) or ast.unparse(node)) for node in tree.body]
    if not any(kind == "test" for kind, _ in steps):
        raise TestFileError("test code holds no top-level assert or call")
    return steps


def code_reward(completion: str, test_code: str, cfg: SandboxConfig = SandboxConfig(), mode: str = "fraction",
                extract: str = "fenced") -> CodeVerdict:
    tests = split_tests(test_code)
    program = extract_program(completion, extract)
    if program is None:
        return CodeVerdict(0.0, "no_program", None)
    result = run_python([("program", program), *tests], cfg)
    n = len(result.tests)
    passed = result.passed
    reward = (passed / n) if mode == "fraction" else float(passed == n)
    if result.timed_out:
        status = "timeout"
    elif not result.program_ok:
        status = "program_error"
    else:
        status = "passed" if passed == n else ("partial" if passed else "failed")
    return CodeVerdict(reward, status, result)
