"""Continuous batching: which sequences run in the next step, and how many of their tokens.

Every step has a token budget (`max_num_batched_tokens`). Running sequences come first, in admission order: a
decoding sequence costs one token, a sequence still in its prompt costs the next chunk of it (chunked prefill: a
long prompt is spread over several steps instead of stalling every decoder behind it). Waiting sequences are
admitted with what budget is left, up to `max_num_seqs` running. When a running sequence needs a KV block and none
is free, the most recently admitted sequence is preempted: its blocks are freed and it goes back to the front of the
queue with its tokens, to be recomputed later (its output so far is kept, and its random stream is indexed by output
position, so the continuation is the same as without preemption)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from align.inference.block_manager import Admit, BlockManager
from align.inference.config import EngineConfig
from align.inference.sequence import Sequence, SeqStatus


@dataclass
class StepPlan:
    """One step's work: seqs[i] processes its next num_tokens[i] tokens (from its num_computed_tokens)."""

    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) KV blocks to copy before the step

    def add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.num_tokens.append(n)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.config.max_num_batched_tokens
        budget, preempted = self._schedule_running(plan, budget)
        if not preempted:  # admitting while memory is short would only preempt again next step
            self._admit_waiting(plan, budget)
        plan.copies = self.block_manager.take_copies()
        return plan

    def _schedule_running(self, plan: StepPlan, budget: int) -> tuple[int, bool]:
        preempted, i = False, 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_pending_tokens, budget)
            while not self.block_manager.reserve(seq, n):
                victim = self.running[-1]  # the newest; never one already planned (those sit before index i)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                plan.add(seq, n)
                budget -= n
                i += 1
        return budget, preempted

    def _admit_waiting(self, plan: StepPlan, budget: int) -> None:
        deferred: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.popleft()
            verdict = self.block_manager.admit(seq)
            if verdict is Admit.DEFER:
                deferred.append(seq)  # its prefix is being computed by another sequence: share it next step
                continue
            if verdict is Admit.NO_SPACE:
                self.waiting.appendleft(seq)
                break
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_pending_tokens, budget)
            plan.add(seq, n)
            budget -= n
        self.waiting.extendleft(reversed(deferred))

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free_seq(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def abort_all(self) -> None:
        """Drop every sequence (after a failed step): blocks freed, queues empty."""
        for seq in self.running:
            self.block_manager.free_seq(seq)
        for seq in (*self.running, *self.waiting):
            seq.status = SeqStatus.FINISHED
        self.running, self.waiting = [], deque()
        self.block_manager.release_copy_sources(self.block_manager.take_copies())

    def advance(self, plan: StepPlan) -> list[Sequence]:
        """Account the tokens the step computed; return the sequences that now need a sampled token."""
        to_sample = []
        for seq, n in zip(plan.seqs, plan.num_tokens):
            old = seq.num_computed_tokens
            seq.num_computed_tokens = old + n
            self.block_manager.mark_computed(seq, old)
            if seq.num_computed_tokens == seq.num_tokens:
                to_sample.append(seq)
        self.block_manager.release_copy_sources(plan.copies)
        return to_sample

    def finish(self, seqs: list[Sequence]) -> None:
        """Retire finished sequences and free their blocks."""
        for seq in seqs:
            seq.status = SeqStatus.FINISHED
            self.block_manager.free_seq(seq)
        if seqs:
            self.running = [s for s in self.running if s.status is SeqStatus.RUNNING]
