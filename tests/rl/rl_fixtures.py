"""Real small pieces for the GRPO tests: a tiny random Mistral, the native sampler on a copy of it, and the parity
task, a pure reward the model can learn in a few steps: a completion earns 1 when its first token id is even.

The parity task's prompts are short id sequences; its reward is a real (if simple) verifier with the signature of
align.eval.verifier.score, not a stand-in for the model: every sample, log-prob and update is computed for real."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import torch

from align.train.train_module import AccumInfo
from align.eval.verifier import RewardResult
from align.inference import EngineConfig
from align.model import MistralConfig, MistralForCausalLM
from align.rl.advantages import AdvantageConfig
from align.rl.batch_source import GrpoBatchSource, PromptSet
from align.rl.curriculum import CurriculumConfig, PromptCurriculum
from align.rl.grpo_loss import GrpoLossConfig
from align.rl.grpo_module import GrpoTrainModule
from align.rl.rewards import CompositeReward, RewardConfig
from align.rl.stage_config import DynamicSamplingConfig, RolloutShape
from align.rl.step_credit import StepCreditConfig
from align.rollout import RolloutConfig, make_rollout_client
from align.train.optim import OptimizerConfig
from align.train.parallel import ParallelConfig
from align.train.schedulers import SchedulerConfig
from align.train.train_module import TrainModuleConfig

EOS = 2
VOCAB = 64
ROOT = Path(__file__).resolve().parents[2]


def launch_two_ranks(worker: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`worker` under torch.distributed.run with two gloo ranks on CPU, one thread each (CUDA hidden: two ranks on
    one GPU would ask for cuda:1; CUDA runs are the gpu tier)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(worker),
           *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def tiny_model(seed: int = 0) -> MistralForCausalLM:
    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                        eos_token_id=EOS)
    return MistralForCausalLM(cfg)


def decode(ids: list[int]) -> str:
    return " ".join(str(i) for i in ids)


def never_right(text: str, gold: str) -> RewardResult:
    """Every sample wrong: every group has zero reward variance, every advantage is 0."""
    return RewardResult(0.0, True, text, "wrong")


def parity_verifier(text: str, gold: str) -> RewardResult:
    """1 when the first generated token id is even (gold "even"); gold "odd" rewards odd; "unusable": None."""
    if gold == "unusable":
        return RewardResult(None, False, None, "gold_unusable")
    first = int(text.split()[0]) if text else -1
    ok = first >= 0 and (first % 2 == 0) == (gold == "even")
    return RewardResult(1.0 if ok else 0.0, True, str(first), "correct" if ok else "wrong")


def parity_prompts(n: int = 16, golds=None) -> PromptSet:
    golds = golds or ["even"] * n
    return PromptSet(ids=lambda r: (1, 10 + int(r) % 40, 11 + int(r) % 30), gold=lambda r: golds[int(r)],
                     groups=[str(1 + r % 3) for r in range(n)])


def make_client(model):
    return make_rollout_client(RolloutConfig(engine=EngineConfig(block_size=4, max_model_len=64)),
                               copy.deepcopy(model))


def make_module(model, client, lr=3e-2, steps=10, loss=GrpoLossConfig(), temperature=1.0, seed=0,
                parallel=ParallelConfig()):
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=lr), scheduler=SchedulerConfig(name="constant"),
                            parallel=parallel)
    return GrpoTrainModule(model, cfg, loss, temperature, constant_length=6, total_steps=steps, seed=seed,
                           client=client)


def make_source(module, client, prompts=None, shape=None, dynamic=DynamicSamplingConfig(enabled=False),
                reward=RewardConfig(), curriculum=CurriculumConfig(), seed=0, verifier=parity_verifier,
                world_size=1, rank=0, advantage=AdvantageConfig(), skip_rows=None, decode=decode,
                step_credit=StepCreditConfig()):
    prompts = prompts or parity_prompts()
    shape = shape or RolloutShape(prompts=4, samples=4, max_new_tokens=6, num_minibatches=2, micro_batch_size=3)
    return GrpoBatchSource(prompts, client, decode, CompositeReward(reward, shape.max_new_tokens, verifier),
                           PromptCurriculum(prompts.groups, curriculum, seed, rank, world_size), shape, dynamic,
                           advantage, seed=seed, eos_id=EOS, policy_version=lambda: module.version,
                           old_scorer=module.score if shape.old_logprobs == "recompute" else None,
                           world_size=world_size, skip_rows=skip_rows, step_credit=step_credit)


def train_window(module, window, edit=None):
    """One optimizer step of a TrainModule over a window of micro-batches (`edit(mb)`: keys to replace first)."""
    window = [dict(mb, **(edit(mb) if edit else {})) for mb in window]
    units = sum(module.loss_units(mb) for mb in window)
    for i, mb in enumerate(window):
        module.train_batch(mb, AccumInfo(i, len(window), units, 1))
    outcome = module.optim_step()
    module.zero_grads()
    return outcome
