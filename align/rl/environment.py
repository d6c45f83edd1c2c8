"""Multi-turn environments: the `Environment` seam, the calculator tool, and `run_episode`, the driver that samples
the policy's turns through a RolloutClient and appends the environment's observations between them.

    env.reset(prompt, meta)                 a fresh episode for one prompt row
    env.step(text) -> EnvStep(observation, done)
                                            text: what the policy wrote since the last step (one segment: up to a
                                            stop token); observation: text appended after it ("" for none)
    env.reward(completion) -> float         the episode's reward, from the whole completion (observations included)

`run_episode` samples a segment, hands it to the environment, encodes the observation and appends it, and samples
again from prompt + everything so far, until the policy is done, `done`, `max_turns` observations or `max_tokens`
completion tokens (policy + observation). Two ways an observation enters (align.rl.env_chat, `[environment]
observation`): as a tool-result turn of the chat template (`tool_turns` given: a segment is the policy's whole turn,
up to its end-of-turn token (EOS); a turn the environment answers is followed by the template's tool turn and the
next assistant header, one with no answer ends the episode), or inline (a segment ends at EOS, which ends the
episode, or at a newline token: a tool call is one line; the observation's plain tokens follow it). Each segment is
its own request with a seed derived from (episode seed, segment), so an episode is a pure function of the weights. The
result marks every token: 1 for the policy's own (they train), 0 for the environment's (never trained: the policy did
not choose them; their log-probs are 0; the batch's `policy_mask` keeps them out of the per-token statistics,
entropy and rho, too). The KV cache is kept across turns: each continuation is a new request for prompt + everything
so far, and the engine's prefix cache, which also keeps the blocks a turn filled while decoding and a finished
turn's partial last block (align.inference.block_manager `cache_generated`), serves all of it: only the previous
turn's last sampled token and the observation are prefilled, exactly what one sequence kept for the episode would
compute (tests/rl/test_env_cache.py: the same episodes bitwise, that token count).

`CalculatorEnv`: a segment holding `<calc>EXPR</calc>` (the inline form), or a tool call in the Hugging Face / Qwen
layout `<tool_call>{"name": "calculator", "arguments": {"expression": "EXPR"}}</tool_call>` (what a chat template
renders for an assistant turn's `tool_calls`; the calc_tiny profile's SFT data, align.data.calctask), is answered with
`<result>VALUE</result>` (integer and decimal arithmetic: + - * / // % ** and parentheses, exact by fractions,
bounded; a call that does not parse, another tool's name or anything else `<result>error</result>`); the last call of
a segment is the one answered. `calls` / `failed` count the episode's calls and those answered `error` (the
evaluation's parse rate, align.rl.env_eval); the reward is the verifier's verdict of the completion against the
row's gold.

GRPO drives it with `[environment]` (align.rl.stage_config.EnvironmentConfig; align.rl.batch_source
`_generate_episodes`: G episodes per prompt, all advanced together, rewarded by the [reward] terms on the whole
completion). The `calc_tiny` profile is the rung where GRPO learns to call it (configs/calc_tiny/, align.data.calctask;
its receipt's before/after evaluation runs greedy episodes through the environment, align.rl.env_eval). The kept
cache is the engine's (a turn's partial block goes to one continuation: the G episodes of a prompt share only full
blocks)."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Protocol

from functools import partial

from align.eval.verifier import score
from align.inference.config import SamplingParams
from align.inference.sequence import derive_seed
from align.rollout.protocol import RolloutClient, RolloutRequest
from align.rl.env_chat import tool_turns_for
from align.rl.ppo.process_rewards import newline_token_ids

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_NAME = "calculator"  # the function name a `<tool_call>` must give
MAX_DIGITS = 60  # a value with more digits (numerator or denominator) is an error, not a bignum computation


@dataclass(frozen=True)
class EnvStep:
    observation: str = ""
    done: bool = False


class Environment(Protocol):
    def reset(self, prompt: str, meta: dict) -> None: ...

    def step(self, text: str) -> EnvStep: ...

    def reward(self, completion: str) -> float: ...


def calculate(expr: str) -> Fraction:
    """Exact value of an arithmetic expression (ValueError for anything else or anything too large)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("not an expression") from None

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            out = Fraction(str(node.value))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            out = value(node.operand) * (-1 if isinstance(node.op, ast.USub) else 1)
        elif isinstance(node, ast.BinOp):
            a, b = value(node.left), value(node.right)
            op = type(node.op)
            if op in (ast.Div, ast.FloorDiv, ast.Mod) and b == 0:
                raise ValueError("division by zero")
            if op is ast.Pow:
                if b.denominator != 1 or abs(b) > 64:
                    raise ValueError("exponent must be an integer up to 64")
                out = a ** int(b)
            else:
                out = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                       ast.Div: lambda: a / b, ast.FloorDiv: lambda: Fraction(a // b),
                       ast.Mod: lambda: a % b}.get(op, lambda: None)()
                if out is None:
                    raise ValueError(f"operator {op.__name__} is not arithmetic")
        else:
            raise ValueError(f"{type(node).__name__} is not arithmetic")
        if max(len(str(abs(out.numerator))), len(str(out.denominator))) > MAX_DIGITS:
            raise ValueError("value too large")
        return out

    return value(tree.body)


def show(value: Fraction) -> str:
    """An integer as itself, anything else as a decimal to 6 places (trailing zeros cut)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def call_expression(text: str) -> str | None:
    """The expression of the last call in `text` (`<calc>` or a calculator `<tool_call>`), "" for a call that does
    not parse, None when `text` makes no call."""
    last = max((m for pattern in (CALL, TOOL_CALL) for m in pattern.finditer(text)), key=lambda m: m.start(),
               default=None)
    if last is None:
        return None
    if last.re is CALL:
        return last.group(1)
    try:
        call = json.loads(last.group(1).strip())
        args = call.get("arguments") if isinstance(call, dict) and call.get("name") == TOOL_NAME else None
        args = json.loads(args) if isinstance(args, str) else args
    except (ValueError, AttributeError):  # not JSON, or arguments' text not JSON
        return ""
    expr = args.get("expression") if isinstance(args, dict) else None
    return expr if isinstance(expr, str) else ""


class CalculatorEnv:
    """The calculator tool over one episode (module doc)."""

    def __init__(self, verifier: Callable = score):
        self.verifier, self.gold, self.calls, self.failed = verifier, "", 0, 0

    def reset(self, prompt: str, meta: dict) -> None:
        self.gold, self.calls, self.failed = str(meta.get("gold", "")), 0, 0

    def step(self, text: str) -> EnvStep:
        expr = call_expression(text)
        if expr is None:
            return EnvStep()
        self.calls += 1
        try:
            result = show(calculate(expr))
        except (ValueError, ZeroDivisionError, OverflowError):
            result = "error"
        self.failed += result == "error"
        return EnvStep(f"<result>{result}</result>\n")

    def reward(self, completion: str) -> float:
        verdict = self.verifier(completion, self.gold).reward
        return float(verdict or 0.0)


@dataclass(frozen=True)
class Episode:
    completion_ids: tuple[int, ...]  # policy and observation tokens, in order
    policy_mask: tuple[float, ...]  # 1: the policy's token (trains), 0: the environment's (never trains)
    logprobs: tuple[float, ...]  # the sampler's log-prob of each policy token; 0 on observation tokens
    finish_reason: str  # stop (EOS or the environment's done) | length (a token budget) | turns | error
    turns: int  # observations appended
    reward: float
    weight_version: int


@dataclass(frozen=True)
class EpisodeStart:
    prompt_ids: tuple[int, ...]
    prompt: str  # the prompt's text, for the environment's reset
    meta: dict
    seed: int  # the episode's seed; segment j samples with derive_seed(seed, j)


EpisodeRunner = Callable[[list["EpisodeStart"]], list["Episode"]]  # what GRPO's batch source calls per round


def run_episodes(client: RolloutClient, starts: list[EpisodeStart], make_env: Callable[[], Environment], *,
                 encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], eos_id: int,
                 newline_ids: tuple[int, ...], temperature: float, max_tokens: int, max_turns: int,
                 tool_turns: Callable[[str], list[int]] | None = None) -> list[Episode]:
    """Many episodes advanced together: every round submits one segment request per episode still running, so the
    engine batches them (module doc). `tool_turns`: an observation's tool-result turn ids (align.rl.env_chat); None:
    observations inline, encoded by `encode`."""
    envs = [make_env() for _ in starts]
    for env, start in zip(envs, starts):
        env.reset(start.prompt, start.meta)
    ids = [[] for _ in starts]
    mask = [[] for _ in starts]
    logp = [[] for _ in starts]
    turns, segments, versions = [0] * len(starts), [0] * len(starts), [-1] * len(starts)
    finish: list[str | None] = [None] * len(starts)
    stops = (eos_id,) if tool_turns is not None else (eos_id, *newline_ids)  # a tool turn follows a whole turn
    while True:
        live = [i for i in range(len(starts)) if finish[i] is None]
        if not live:
            break
        requests = [RolloutRequest(tuple(starts[i].prompt_ids) + tuple(ids[i]), 1,
                                   SamplingParams(temperature=temperature, max_new_tokens=max_tokens - len(ids[i]),
                                                  stop_token_ids=stops),
                                   seed=derive_seed(starts[i].seed, segments[i]), request_id=i) for i in live]
        for res in client.collect(client.submit(requests)).results:
            i = res.request_id
            segments[i] += 1
            versions[i] = res.weight_version
            finish[i] = _advance(res, envs[i], ids[i], mask[i], logp[i], turns, i, tool_turns or encode, decode,
                                 eos_id, max_tokens, max_turns, tool_turns is not None)
    return [Episode(tuple(ids[i]), tuple(mask[i]), tuple(logp[i]), finish[i], turns[i], envs[i].reward(decode(ids[i])),
                    versions[i]) for i in range(len(starts))]


def _advance(res, env: Environment, ids: list, mask: list, logp: list, turns: list, i: int, encode, decode,
             eos_id: int, max_tokens: int, max_turns: int, turn_ends_at_eos: bool) -> str | None:
    """One sampled segment into episode i; its finish reason, or None while it goes on. `encode`: an observation's
    ids (its tool turn, or its plain tokens); `turn_ends_at_eos`: EOS closes the policy's turn, not the episode."""
    if res.finish_reason == "error":
        return "error"
    ids += res.completion_ids
    mask += [1.0] * len(res.completion_ids)
    logp += res.logprobs
    ended = bool(res.completion_ids) and res.completion_ids[-1] == eos_id
    if ended and not turn_ends_at_eos:
        return "stop"
    if (res.finish_reason == "length" and not ended) or len(ids) >= max_tokens:
        return "length"
    step = env.step(decode(list(res.completion_ids)))
    if step.done or (ended and not step.observation):
        return "stop"
    if step.observation:
        if turns[i] >= max_turns:
            return "turns"
        obs = encode(step.observation)[: max_tokens - len(ids)]
        ids += obs
        mask += [0.0] * len(obs)
        logp += [0.0] * len(obs)
        turns[i] += 1
        if len(ids) >= max_tokens:
            return "length"
    return None


def run_episode(client: RolloutClient, prompt_ids: tuple[int, ...], env: Environment, *, prompt: str, meta: dict,
                encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], eos_id: int,
                newline_ids: tuple[int, ...], temperature: float, max_tokens: int, max_turns: int, seed: int,
                tool_turns: Callable[[str], list[int]] | None = None) -> Episode:
    """One episode (module doc)."""
    return run_episodes(client, [EpisodeStart(tuple(prompt_ids), prompt, meta, seed)], lambda: env, encode=encode,
                        decode=decode, eos_id=eos_id, newline_ids=newline_ids, temperature=temperature,
                        max_tokens=max_tokens, max_turns=max_turns, tool_turns=tool_turns)[0]


ENVIRONMENTS: dict[str, Callable[[], Environment]] = {"calculator": CalculatorEnv}


def episode_kwargs(cfg, tok, shape) -> dict:
    """run_episodes' keyword arguments for `[environment]` `cfg` over `tok` (all but the client, the environment
    factory and the temperature): observations as tool-result turns of the tokenizer's chat template
    (`observation`, align.rl.env_chat), else inline: segments end at EOS or a newline token of the tokenizer,
    observations encoded without special tokens. The rollouts' and the greedy evaluation's (align.rl.env_eval)."""
    newline = tuple(int(i) for i in newline_token_ids(tok).nonzero().flatten().tolist())
    return dict(encode=lambda text: tok.encode(text), decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                eos_id=tok.eos_id, newline_ids=newline, max_tokens=cfg.max_tokens or shape.max_new_tokens,
                max_turns=cfg.max_turns, tool_turns=tool_turns_for(tok, cfg.observation))


def episode_runner(cfg, client: RolloutClient, tok, shape) -> EpisodeRunner | None:
    """The batch source's runner for `[environment]` (align.rl.stage_config.EnvironmentConfig), None without one:
    `episode_kwargs` at the rollout's temperature."""
    if cfg is None:
        return None
    return partial(run_episodes, client, make_env=ENVIRONMENTS[cfg.name], temperature=shape.temperature,
                   **episode_kwargs(cfg, tok, shape))
