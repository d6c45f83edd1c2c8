"""math_verify as the oracle, configured the way TRL's `accuracy_reward` uses it for GRPO: the gold parsed with the
default extraction (wrapped in `$...$`, since bare LaTeX such as `\\sqrt{8}` parses to nothing), the completion with
boxed-first LaTeX extraction and no anchor-free fallback, then `verify`. Runs in worker processes: math_verify's
timeouts use signal.alarm, which needs each worker's main thread. Timeouts are detected from its log warnings."""

from __future__ import annotations

import logging
from contextlib import contextmanager

TIMEOUT_S = 2  # TRL uses 10 s to parse and 5 s to verify; 2 s keeps the hanging cases cheap (they time out anyway)


class _TimeoutFlag(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.hit = False

    def emit(self, record: logging.LogRecord) -> None:
        if "Timeout" in record.getMessage():
            self.hit = True


@contextmanager
def _timeout_watch():
    """A flag set when math_verify logs a timeout while the block runs (its verdict is then meaningless)."""
    flag = _TimeoutFlag()
    loggers = [logging.getLogger("math_verify.parser"), logging.getLogger("math_verify.grader")]
    for lg in loggers:
        lg.addHandler(flag)
        lg.propagate = False
    try:
        yield flag
    finally:
        for lg in loggers:
            lg.removeHandler(flag)


def math_verify_verdict(gold: str, response: str) -> str:
    """"1" correct, "0" wrong, "N" gold unparseable, "T" math_verify timed out."""
    from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    with _timeout_watch() as flag:
        gold_parsed = parse(f"${gold}$", parsing_timeout=TIMEOUT_S)
        if not gold_parsed:
            return "T" if flag.hit else "N"
        pred_cfg = [LatexExtractionConfig(normalization_config=NormalizationConfig(units=True),
                                          boxed_match_priority=0, try_extract_without_anchor=False)]
        pred = parse(response, extraction_config=pred_cfg, extraction_mode="first_match", parsing_timeout=TIMEOUT_S)
        ok = verify(gold_parsed, pred, timeout_seconds=TIMEOUT_S)
        return "T" if flag.hit else ("1" if ok else "0")


def default_verdict(gold: str, pred: str) -> str:
    """math_verify as a new user calls it, `verify(parse(gold), parse(pred))` with every default: "1" equivalent,
    "0" not (or either side parsed to nothing), "E" it raised, "T" it timed out."""
    from math_verify import parse, verify

    with _timeout_watch() as flag:
        try:
            ok = verify(parse(gold, parsing_timeout=TIMEOUT_S), parse(pred, parsing_timeout=TIMEOUT_S),
                        timeout_seconds=TIMEOUT_S)
        except Exception:  # noqa: BLE001 - counted and reported by the caller
            return "E"
        return "T" if flag.hit else ("1" if ok else "0")


def verdicts(pairs: list[tuple[str, str]], verdict=math_verify_verdict) -> list[str]:
    """math_verify's verdicts for (gold, response) pairs, on two worker processes (spawned: no torch fork)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(verdict, *zip(*pairs), chunksize=8))
