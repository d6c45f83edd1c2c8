"""The `[reward] terms` registry: named, weighted reward terms that `CompositeReward` (align.rl.rewards) sums.

    [reward]
    terms = [
      { name = "verifier", weight = 1.0, step_check = true },     # answer match (align.eval.verifier.score)
      { name = "format", weight = 0.1, layout = "think" },         # <think>...</think> then a boxed answer
      { name = "length", weight = 1.0, buffer = 16, penalty = 1.0 },   # DAPO's soft overlong penalty
      { name = "python", weight = 0.5, function = "mypkg.rewards:score", timeout_s = 2.0 },
    ]

Each term maps one sample to a value (unweighted; the history logs its mean as `rollout/term_mean/<label>`), and
the sample's total is the weighted sum in the listed order, accumulated left to right from the first term:
    total = w_1 v_1 (+ w_2 v_2) (+ ...)
A term that cannot judge a sample returns None (the verifier on a gold it cannot read, code_tests on a test file
that does not parse): the sample is invalid and its group dropped, as before. A term that fails on a sample (the
user's function raising or running past its time) gives 0 and is counted (`rollout/term_failures/<label>`).

    verifier               1 / 0 by the verifier; `step_check`: 0 for a right box after a false `a op b = c` step
    format                 1 / 0: `layout` "boxed" (the verifier's format signal: exactly one non-empty box),
                           "think" (one `<think>...</think>` block first, one boxed answer after it), or a `pattern`
                           (a regular expression the whole completion must match)
    length                 -(DAPO soft overlong): 0 up to max_new_tokens - buffer, down to -penalty at the limit
    truncation             -1 for a completion cut at max_new_tokens, else 0
    python                 a user's `module:function(prompt, completion, meta) -> float`, in a worker process
                           (align.rl.user_reward), bounded by `timeout_s`
    code_tests             the completion's program against the row's tests in the sandbox (align.sandbox):
                           `mode` "fraction" (passed / tests) or "all"; the tests are the row's gold text
    reward_model           a Bradley-Terry reward model's score of prompt + completion (`path` under <runs>)
    process_reward_model   a process reward model's step beliefs 2 sigmoid(logit) - 1 at each step's end,
                           aggregated over the steps by `aggregate` = "min" | "mean" | "last" (`path` under <runs>)
The verifier and code_tests are outcome terms: the first one listed gives the sample's `outcome` (what `correct`,
the pass rate and the accuracy columns read). The two model terms score token batches (align.rl.reward_models
loads their checkpoints and attaches the scorers).

Without `terms`, the table's older keys are the term list (`legacy_terms`): verifier (outcome_weight,
step_check), format "boxed" (format_weight), length (weight 1, overlong_buffer / overlong_penalty) and truncation
(truncation_penalty), in that order, which computes the old expression bit for bit."""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from align.eval.verifier import RewardResult, score
from align.registry import Registry
from align.rl.user_reward import UserFunction
from align.sandbox.code_tests import TestFileError, code_reward
from align.sandbox.run import SandboxConfig
from align.verify.step_check import false_steps

OPTION_NAMES = ("step_check", "layout", "pattern", "buffer", "penalty", "function", "timeout_s", "path",
                "aggregate", "mode", "extract", "cpu_s", "memory_mb", "workers")
THINK = re.compile(r"\s*<think>(?:(?!<think>).)*?</think>(.*)", re.DOTALL)


@dataclass(frozen=True)
class RewardTermConfig:
    """One entry of `[reward] terms`: a registry name, its weight, and the options that term takes (an option
    another term takes is refused here; None: the term's default)."""

    name: str
    weight: float = 1.0
    label: str | None = None  # the history / receipt key (default: name); must be unique in the list
    step_check: bool | None = None  # verifier
    layout: str | None = None  # format: boxed | think
    pattern: str | None = None  # format: a regular expression the whole completion must match
    buffer: int | None = None  # length
    penalty: float | None = None  # length
    function: str | None = None  # python: module:function
    timeout_s: float | None = None  # python, code_tests
    path: str | None = None  # reward_model, process_reward_model: a checkpoint under <runs>
    aggregate: str | None = None  # process_reward_model: min | mean | last
    mode: str | None = None  # code_tests: fraction | all
    extract: str | None = None  # code_tests: fenced | whole
    cpu_s: int | None = None  # code_tests
    memory_mb: int | None = None  # code_tests
    workers: int | None = None  # code_tests: sandboxes run at once

    def __post_init__(self):
        if self.name not in REWARD_TERMS:  # a ValueError: the config loader names the file and the table
            raise ValueError(f"unknown reward term {self.name!r}; registered: {', '.join(REWARD_TERMS.names())}")
        term = REWARD_TERMS.get(self.name)
        if not math.isfinite(self.weight):
            raise ValueError(f"reward term {self.name!r}: weight must be finite, got {self.weight}")
        extra = [o for o in OPTION_NAMES if getattr(self, o) is not None and o not in term.OPTIONS]
        if extra:
            raise ValueError(f"reward term {self.name!r} takes no option {extra[0]!r} (its options: "
                             f"{', '.join(sorted(term.OPTIONS)) or 'none'})")
        term.check(self)

    @property
    def key(self) -> str:
        return self.label or self.name

    def opt(self, name: str, default):
        value = getattr(self, name)
        return default if value is None else value


@dataclass
class TermInput:
    """One sample as the terms see it. `cache` lets terms share work (the verifier's verdict)."""

    completion: str
    gold: str
    num_tokens: int
    finish_reason: str
    prompt: str = ""
    meta: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TermValue:
    value: float | None  # None: the term cannot judge this sample (the sample is invalid)
    status: str = ""
    failed: bool = False  # the term failed on this sample (exception, timeout); value is then 0
    format_ok: bool | None = None  # the verifier's format signal (SampleReward.format_ok)


class Term:
    """A built term. `outcome`: its value is the sample's outcome; `batch`: scored on token batches instead."""

    OPTIONS: frozenset = frozenset()
    outcome = False
    batch = False

    def __init__(self, cfg: RewardTermConfig, ctx: "TermContext"):
        self.cfg, self.key, self.weight = cfg, cfg.key, cfg.weight

    @classmethod
    def check(cls, cfg: RewardTermConfig) -> None:
        """Refuse bad option values at config time (ValueError names the term and option)."""

    def __call__(self, x: TermInput) -> TermValue:
        raise NotImplementedError

    def many(self, xs: list[TermInput]) -> list[TermValue]:
        return [self(x) for x in xs]

    def start(self) -> None:
        """Acquire what the term needs now (a worker process), so that a bad option stops the stage at once."""

    def close(self) -> None:
        """Release what the term holds (a worker process)."""


@dataclass(frozen=True)
class TermContext:
    max_new_tokens: int
    verifier: Callable[[str, str], RewardResult] = score


REWARD_TERMS: Registry[type[Term]] = Registry("reward term")


def _one_of(cfg: RewardTermConfig, option: str, allowed: tuple[str, ...]) -> None:
    value = getattr(cfg, option)
    if value is not None and value not in allowed:
        raise ValueError(f"reward term {cfg.name!r}: {option} must be one of {', '.join(allowed)}, got {value!r}")


def _positive(cfg: RewardTermConfig, *options: str) -> None:
    for option in options:
        value = getattr(cfg, option)
        if value is not None and not value > 0:
            raise ValueError(f"reward term {cfg.name!r}: {option} must be > 0, got {value}")


def verdict(x: TermInput, verifier: Callable[[str, str], RewardResult]) -> RewardResult:
    if "verdict" not in x.cache:
        x.cache["verdict"] = verifier(x.completion, x.gold)
    return x.cache["verdict"]


@REWARD_TERMS.register("verifier")
class VerifierTerm(Term):
    OPTIONS = frozenset({"step_check"})
    outcome = True

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.verifier, self.step_check = ctx.verifier, cfg.opt("step_check", False)

    def __call__(self, x):
        v = verdict(x, self.verifier)
        if v.reward is None:
            return TermValue(None, v.status, format_ok=v.format_ok)
        outcome, status = v.reward, v.status
        if self.step_check and outcome and false_steps(x.completion):
            outcome, status = 0.0, "false_step"
        return TermValue(outcome, status, format_ok=v.format_ok)


@REWARD_TERMS.register("format")
class FormatTerm(Term):
    OPTIONS = frozenset({"layout", "pattern"})

    @classmethod
    def check(cls, cfg):
        _one_of(cfg, "layout", ("boxed", "think"))
        if cfg.layout is not None and cfg.pattern is not None:
            raise ValueError("reward term 'format': give a layout or a pattern, not both")
        if cfg.pattern is not None:
            try:
                re.compile(cfg.pattern)
            except re.error as exc:
                raise ValueError(f"reward term 'format': pattern does not compile: {exc}") from None

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.verifier, self.layout = ctx.verifier, cfg.opt("layout", "boxed")
        self.pattern = re.compile(cfg.pattern, re.DOTALL) if cfg.pattern is not None else None

    def __call__(self, x):
        if self.pattern is not None:
            return TermValue(float(self.pattern.fullmatch(x.completion) is not None))
        if self.layout == "boxed":
            return TermValue(float(verdict(x, self.verifier).format_ok))
        m = THINK.fullmatch(x.completion)  # "think": the reasoning block, then exactly one non-empty box after it
        if m is None or "<think>" in m.group(1) or "</think>" in m.group(1):
            return TermValue(0.0)
        return TermValue(float(self.verifier(m.group(1), x.gold).format_ok))


def soft_overlong(num_tokens: int, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment: 0 up to L - buffer, then linear to `penalty` at L (and beyond)."""
    if buffer <= 0:
        return 0.0
    over = num_tokens - (max_new_tokens - buffer)
    return 0.0 if over <= 0 else penalty * min(1.0, over / buffer)


@REWARD_TERMS.register("length")
class LengthTerm(Term):
    OPTIONS = frozenset({"buffer", "penalty"})

    @classmethod
    def check(cls, cfg):
        for option in ("buffer", "penalty"):
            if getattr(cfg, option) is not None and getattr(cfg, option) < 0:
                raise ValueError(f"reward term 'length': {option} must be >= 0, got {getattr(cfg, option)}")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.max_new_tokens, self.buffer, self.penalty = ctx.max_new_tokens, cfg.opt("buffer", 0), \
            cfg.opt("penalty", 1.0)

    def __call__(self, x):
        return TermValue(-soft_overlong(x.num_tokens, self.max_new_tokens, self.buffer, self.penalty))


@REWARD_TERMS.register("truncation")
class TruncationTerm(Term):
    def __call__(self, x):
        return TermValue(-float(x.finish_reason == "length"))


@REWARD_TERMS.register("python")
class PythonTerm(Term):
    OPTIONS = frozenset({"function", "timeout_s"})

    @classmethod
    def check(cls, cfg):
        fn = cfg.function or ""
        module, _, name = fn.partition(":")
        if not module or not name.isidentifier():
            raise ValueError(f"reward term 'python': function must be 'module:function', got {fn!r}")
        _positive(cfg, "timeout_s")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.fn = UserFunction(cfg.function, cfg.opt("timeout_s", 2.0))  # its worker starts on the first call

    def __call__(self, x):
        value, status = self.fn(x.prompt, x.completion, x.meta)
        return TermValue(0.0 if value is None else value, status, failed=value is None)

    def start(self):
        self.fn.start()

    def close(self):
        self.fn.close()


@REWARD_TERMS.register("code_tests")
class CodeTestsTerm(Term):
    OPTIONS = frozenset({"mode", "extract", "timeout_s", "cpu_s", "memory_mb", "workers"})
    outcome = True

    @classmethod
    def check(cls, cfg):
        _one_of(cfg, "mode", ("fraction", "all"))
        _one_of(cfg, "extract", ("fenced", "whole"))
        _positive(cfg, "timeout_s", "cpu_s", "memory_mb", "workers")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        base = SandboxConfig()
        self.sandbox = SandboxConfig(timeout_s=cfg.opt("timeout_s", base.timeout_s), cpu_s=cfg.opt("cpu_s", base.cpu_s),
                                     memory_mb=cfg.opt("memory_mb", base.memory_mb))
        self.mode, self.extract, self.workers = cfg.opt("mode", "fraction"), cfg.opt("extract", "fenced"), \
            cfg.opt("workers", 2)

    def __call__(self, x):
        try:
            v = code_reward(x.completion, x.gold, self.sandbox, self.mode, self.extract)
        except TestFileError:
            return TermValue(None, "tests_unusable")
        return TermValue(v.reward, v.status)

    def many(self, xs):
        if self.workers == 1 or len(xs) < 2:
            return [self(x) for x in xs]
        with ThreadPoolExecutor(self.workers) as pool:  # each run waits on its own child process
            return list(pool.map(self, xs))


class BatchTerm(Term):
    """A term scored on token batches by a model; `scorer` (micro-batch -> (N,) scores) is attached after load."""

    OPTIONS = frozenset({"path"})
    batch = True

    @classmethod
    def check(cls, cfg):
        if not cfg.path:
            raise ValueError(f"reward term {cfg.name!r} needs `path`, a checkpoint under <runs>")

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.scorer = None


@REWARD_TERMS.register("reward_model")
class RewardModelTerm(BatchTerm):
    pass


@REWARD_TERMS.register("process_reward_model")
class ProcessRewardModelTerm(BatchTerm):
    OPTIONS = frozenset({"path", "aggregate"})

    @classmethod
    def check(cls, cfg):
        super().check(cfg)
        _one_of(cfg, "aggregate", ("min", "mean", "last"))


def build_terms(configs: tuple[RewardTermConfig, ...], ctx: TermContext) -> list[Term]:
    keys = [c.key for c in configs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError(f"[reward] terms: label {dup[0]!r} is used twice (give each a distinct `label`)")
    return [REWARD_TERMS.get(c.name)(c, ctx) for c in configs]


def legacy_terms(outcome_weight: float, format_weight: float, overlong_buffer: int, overlong_penalty: float,
                 truncation_penalty: float, step_check: bool) -> tuple[RewardTermConfig, ...]:
    """The older `[reward]` keys as the term list that computes
    outcome_weight * outcome + format_weight * format_ok - overlong - truncation_penalty * truncated bit for bit
    (x + (-y) is x - y in IEEE arithmetic, 1.0 * y is y, and w * -t is -(w * t))."""
    return (RewardTermConfig("verifier", outcome_weight, step_check=step_check),
            RewardTermConfig("format", format_weight, layout="boxed"),
            RewardTermConfig("length", 1.0, buffer=overlong_buffer, penalty=overlong_penalty),
            RewardTermConfig("truncation", truncation_penalty))

