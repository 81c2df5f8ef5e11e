"""The chunk schedule: how a stored request's prefill was computed, and so which Mamba states exist.

vLLM writes a Mamba group's recurrent state only where a scheduler step ends (align mode): the state
after exactly t tokens exists when some prefill chunk ended at t and t is a multiple of the group's
block size b, or t is the prompt checkpoint C and a chunk ended there (or a prefill checkpoint block
exported it inside the last chunk).  The store rule can only store states that exist.  The scheduler
cuts each step's chunk (at most the token budget) to Mamba block ends and stops it at the mandatory
positions below; this module derives those chunk ends for one cold request, as the rule set's
scheduler does (vLLM 0.33.0 / 0.34.0: ``Scheduler._mamba_block_aligned_split``).

The ``block`` schedule (no budget) ends a chunk at every Mamba block end: every state exists.  It is
vLLM's schedule whenever the budget is at most b, the model of PR #53324, and the schedule under which
kvspec's closed forms, proofs and vectors are stated.
"""

from __future__ import annotations

import functools
import math

import attrs

from .boundaries import Boundaries, make_boundaries, make_run
from .errors import SpecError
from .geometry import Geometry, compute_alignment, compute_group_ids, compute_lcm_span, has_eagle, is_fine
from .limits import MAX_CHUNK_ENDS, RULE_LIMIT_CHUNKS
from .types import Tokens

RULE_SCHEDULE = "schedule"
RULE_UNSCHEDULABLE = "schedule-unschedulable"


@attrs.frozen(kw_only=True, cache_hash=True)
class Schedule:
    """How a stored request's prefill was scheduled: the per-step token budget and the scheduler's options."""

    budget: int | None = None  # max_num_batched_tokens the request gets each step; None: the block schedule
    chunked: bool = True  # enable_chunked_prefill; off: a prompt over the budget is never scheduled
    checkpoint_alignment: int | None = None  # prefill checkpoint blocks (FlashKDA 16, Mamba2 1); None: none
    long_prefill_threshold: int = 0  # long_prefill_token_threshold (0: off)
    stop_every: int = 0  # kvspec's proposal, not vLLM's: also end a chunk at every multiple k·K of this and at the
    #                      Mamba block end before it, k·K − b (where an EAGLE-dropped hit lands); 0: off
    ends: tuple[int, ...] = ()  # observed chunk ends (a trace: concurrency, preemption) instead of a derivation
    starts: tuple[int, ...] = ()  # the observed chunks' starts, one per end (needed with checkpoint blocks)
    junctions: tuple[int, ...] = ()  # the shared-prefix junction vLLM had pinned when each chunk ran (one per end,
    #                                   0: none; Marconi-style): a chunk end it aligns to is retained

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.junctions, tuple) or any(
                not isinstance(j, int) or isinstance(j, bool) or j < 0 for j in self.junctions):
            raise SpecError(RULE_SCHEDULE, f"junctions must be integers >= 0, got {self.junctions!r}")
        if self.junctions and len(self.junctions) != len(self.ends):
            raise SpecError(RULE_SCHEDULE, "a junction is observed per chunk: one per chunk end (0: none)")
        if self.ends:
            if not isinstance(self.ends, tuple) or any(not isinstance(e, int) or isinstance(e, bool) or e < 1
                                                         for e in self.ends):
                raise SpecError(RULE_SCHEDULE, f"chunk ends must be integers >= 1, got {self.ends!r}")
            if (self.budget, self.stop_every, self.long_prefill_threshold) != (None, 0, 0):
                raise SpecError(RULE_SCHEDULE, "observed chunk ends replace the derivation: give them without a "
                                               "budget, threshold or stop_every")
            if self.starts and (len(self.starts) != len(self.ends) or not isinstance(self.starts, tuple)
                                or any(not isinstance(a, int) or not 0 <= a < e for a, e in zip(self.starts, self.ends))):
                raise SpecError(RULE_SCHEDULE, "chunk starts: one integer per end, 0 <= start < end")
            if self.checkpoint_alignment is not None and not self.starts:
                raise SpecError(RULE_SCHEDULE, "observed chunks with checkpoint blocks need their starts")
        for what, x, lo in (("chunk budget", self.budget, 1), ("checkpoint alignment", self.checkpoint_alignment, 1),
                            ("long prefill threshold", self.long_prefill_threshold, 0),
                            ("stop_every", self.stop_every, 0)):
            if x is not None and (not isinstance(x, int) or isinstance(x, bool) or x < lo):
                raise SpecError(RULE_SCHEDULE, f"{what} must be an integer >= {lo}, got {x!r}")
        if not isinstance(self.chunked, bool):
            raise SpecError(RULE_SCHEDULE, f"chunked must be true or false, got {self.chunked!r}")


BLOCK_SCHEDULE = Schedule()


@attrs.frozen(kw_only=True)
class Checkpoints:
    """The positions a cold prefill left Mamba states at: every chunk end, and the states prefill checkpoint blocks
    exported inside chunks (every chunk's under dense retention, the last chunk's under replay retention)."""

    ends: tuple[Tokens, ...]
    internals: tuple[Tokens, ...] = ()


def describe_schedule(schedule: Schedule) -> str:
    """Return the schedule in words: 'block', 'observed chunk ends' or 'budget B' with its options."""
    if schedule.ends:
        return f"observed chunk ends ({len(schedule.ends)})"
    if schedule.budget is None:
        return "block (a chunk ends at every Mamba block end)"
    out = [f"budget {schedule.budget}"]
    if not schedule.chunked:
        out.append("chunked prefill off")
    if schedule.checkpoint_alignment is not None:
        out.append(f"prefill checkpoint blocks (alignment {schedule.checkpoint_alignment})")
    if schedule.long_prefill_threshold:
        out.append(f"long prefill threshold {schedule.long_prefill_threshold}")
    if schedule.stop_every:
        out.append(f"a chunk also ends at every multiple of {schedule.stop_every} and the Mamba block end before it "
                   f"(kvspec's proposal)")
    return ", ".join(out)


def compute_scheduler_block(geometry: Geometry) -> Tokens:
    """Return b_s = gcd of the Mamba block sizes (vLLM has one, cache_config.block_size), 0 without a Mamba group."""
    return Tokens(math.gcd(*(geometry.groups[g].block_size for g in compute_group_ids(geometry, "mamba"))))


def compute_checkpoint_position(n: Tokens, size: Tokens, drop: bool, lookahead: int) -> Tokens:
    """Return max(⌊n/size⌋·size − size, 0) with the EAGLE drop, else max(⌊(n − max(1, λ))/size⌋·size, 0)."""
    if drop:
        return Tokens(max(n // size * size - size, 0))
    return Tokens(max(n - max(1, lookahead), 0) // size * size)


def is_partial(geometry: Geometry) -> bool:
    """Return whether hits land below the scheduler block (fine mode and a < L): the connector's partial hits, and
    the scheduler then stops a chunk at C."""
    return is_fine(geometry) and compute_alignment(geometry) < compute_lcm_span(geometry)


def is_internal_checkpoint(schedule: Schedule, geometry: Geometry, start: Tokens, end: Tokens,
                           position: Tokens) -> bool:
    """Return whether a prefill checkpoint block exports C inside the chunk [start, end): start a unit multiple, C
    at least a unit past start and strictly inside, C − start a multiple of the alignment, and C's block column past
    the chunk's initial state column (⌈end/b⌉ − 2 > ⌊(start − 1)/b⌋)."""
    align, u, b = schedule.checkpoint_alignment, geometry.unit, compute_scheduler_block(geometry)
    if align is None:
        return False
    return (start % u == 0 and -(-end // b) - 2 > (start - 1) // b and start + u <= position
            and start < position < end and (position - start) % align == 0)


def compute_chunk_split(schedule: Schedule, geometry: Geometry, prompt: Tokens, lookahead: int, start: Tokens,
                        offered: Tokens) -> Tokens:
    """Return the chunk's length: the offered tokens cut to a Mamba block end unless the chunk finishes the prompt
    (or the block is wider than a chunk can be), then stopped at the first mandatory position strictly inside it —
    the next block end of a chunk that starts mid-block, the last cacheable block end (C at block size b), and C at
    unit size when hits land inside a block (with kvspec's proposal also every k·K and k·K − b)."""
    b, u, drop = compute_scheduler_block(geometry), geometry.unit, has_eagle(geometry)
    partial = is_partial(geometry)
    end = start + offered
    position = compute_checkpoint_position(prompt, compute_alignment(geometry), drop, lookahead)
    internal = end >= prompt and is_internal_checkpoint(schedule, geometry, start, Tokens(end), position)
    last_cache = Tokens(0) if internal else compute_checkpoint_position(prompt, b, drop, lookahead)
    if end < prompt:
        cap = schedule.budget or b
        if schedule.long_prefill_threshold > 0:
            cap = min(cap, schedule.long_prefill_threshold)
        aligned = end // b * b
        if aligned > start or b <= cap:
            end = aligned
    tail = compute_checkpoint_position(prompt, Tokens(u), drop, lookahead) if partial and not internal else 0
    k = schedule.stop_every
    stops = (
        (start // b + 1) * b if start % b != 0 and not internal else 0,
        last_cache,
        tail if last_cache < tail < prompt else 0,
        (start // k + 1) * k if k else 0,
        ((start + b) // k + 1) * k - b if k else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return Tokens(max(end - start, 0))


@functools.lru_cache(maxsize=65536)  # pure over frozen values: one schedule per (geometry, prompt, λ)
def compute_checkpoints(schedule: Schedule, geometry: Geometry, prompt: Tokens, lookahead: int = 0) -> Checkpoints:
    """Return the chunk ends of a cold prefill of P tokens (each step offered min(P − done, budget, threshold)
    tokens, then split) and the checkpoints prefill checkpoint blocks export: in a chunk [s, e) the position
    max(⌊e/a⌋·a − a, 0) with EAGLE, else ⌊(e − max(1, λ))/a⌋·a, when valid there — on every chunk under dense
    retention, on the last under replay retention. The block schedule ends a chunk at every multiple of b_s and
    at C."""
    b = compute_scheduler_block(geometry)
    if b == 0 or prompt <= 0:
        return Checkpoints(ends=(prompt,) if prompt > 0 else ())
    if schedule.ends:  # a trace: every chunk end it names (a resumed request may end chunks twice), then P
        if max(schedule.ends) > prompt:
            raise SpecError(RULE_SCHEDULE, f"chunk end {max(schedule.ends)} is past the stored prompt {prompt}")
        seen: list[Tokens] = []
        if schedule.checkpoint_alignment is not None:
            for start, end in zip(schedule.starts, schedule.ends):
                seen += compute_chunk_export(schedule, geometry, prompt, lookahead, Tokens(start), Tokens(end))
        return Checkpoints(ends=tuple(sorted({*(Tokens(e) for e in schedule.ends), prompt})), internals=tuple(seen))
    if schedule.budget is None:
        c = compute_checkpoint_position(prompt, compute_alignment(geometry), has_eagle(geometry), lookahead)
        every = {Tokens(k * b) for k in range(1, prompt // b + 1)} | {prompt} | ({c} if c > 0 else set())
        return Checkpoints(ends=tuple(sorted(every)))
    if not schedule.chunked and prompt > schedule.budget:
        raise SpecError(RULE_UNSCHEDULABLE,
                        f"with chunked prefill off a prompt of {prompt} tokens never fits max_num_batched_tokens "
                        f"{schedule.budget} (vLLM leaves it waiting): raise the budget or turn chunked prefill on")
    cap = min(schedule.budget, schedule.long_prefill_threshold or schedule.budget)  # no chunk holds more tokens
    if prompt // max(cap, 1) > MAX_CHUNK_ENDS:  # at least ⌈P/cap⌉ chunks: refused before any is cut
        raise SpecError(RULE_LIMIT_CHUNKS, f"a budget of {cap} tokens a step cuts a prompt of {prompt} tokens into more "
                                           f"than {MAX_CHUNK_ENDS} chunks (spec/limits.py): use a larger budget")
    ends: list[Tokens] = []
    internals: list[Tokens] = []
    done = Tokens(0)
    while done < prompt:
        offered = prompt - done
        if 0 < schedule.long_prefill_threshold < offered:
            offered = schedule.long_prefill_threshold
        n = compute_chunk_split(schedule, geometry, prompt, lookahead, done, Tokens(min(offered, schedule.budget)))
        if n <= 0:
            raise SpecError(RULE_UNSCHEDULABLE, f"the scheduler makes no progress at token {done} (budget "
                                                f"{schedule.budget}, Mamba block {b})")
        end = Tokens(done + n)
        internals += compute_chunk_export(schedule, geometry, prompt, lookahead, done, end)
        done = end
        ends.append(done)
        if len(ends) > MAX_CHUNK_ENDS:  # counted as they are cut: a budget, threshold or stop_every of a few tokens
            raise SpecError(RULE_LIMIT_CHUNKS,
                            f"the schedule (budget {schedule.budget}, threshold {schedule.long_prefill_threshold}, "
                            f"stop_every {schedule.stop_every}) cuts a prompt of {prompt} tokens into more than "
                            f"{MAX_CHUNK_ENDS} chunks (spec/limits.py): use a larger budget or threshold")
    return Checkpoints(ends=tuple(ends), internals=tuple(internals))


def compute_chunk_export(schedule: Schedule, geometry: Geometry, prompt: Tokens, lookahead: int, start: Tokens,
                         end: Tokens) -> list[Tokens]:
    """Return the states prefill checkpoint blocks leave inside the chunk [start, end): the checkpoint formula of
    its end at alignment a, when valid there — on every chunk under dense retention, the last under replay — and,
    for a chunk that starts mid-block (a partial prefix hit) and runs past it, the next block end."""
    if schedule.checkpoint_alignment is None:
        return []
    b = compute_scheduler_block(geometry)
    out = [Tokens(-(-start // b) * b)] if start % b and -(-start // b) * b < end else []
    if geometry.retention != "dense" and end < prompt:
        return out
    q = compute_checkpoint_position(end, compute_alignment(geometry), has_eagle(geometry), lookahead)
    return out + [q] if is_internal_checkpoint(schedule, geometry, start, end, q) else out


def compute_pinned(schedule: Schedule, geometry: Geometry, prompt: Tokens, lookahead: int = 0
                   ) -> tuple[tuple[int, int], ...]:
    """Return (position, J) for every state a traced chunk left (its end, what checkpoint blocks exported in it)
    with the junction J pinned while it ran (J > 0 only)."""
    starts = schedule.starts or (0,) * len(schedule.ends)
    return tuple((pos, j) for s, e, j in zip(starts, schedule.ends, schedule.junctions) if j
                 for pos in (e, *compute_chunk_export(schedule, geometry, prompt, lookahead, Tokens(s), Tokens(e))))


def compute_mamba_states(checkpoints: Checkpoints, block_size: int, checkpoint: Tokens) -> frozenset[Tokens]:
    """Return the positions a Mamba group of block size b holds a state at: chunk ends and exported checkpoints that
    are multiples of b, and C when a chunk ended there or a checkpoint block exported it (others are overwritten)."""
    out = {e for e in (*checkpoints.ends, *checkpoints.internals) if e % block_size == 0}
    if checkpoint > 0 and (checkpoint in checkpoints.ends or checkpoint in checkpoints.internals):
        out.add(checkpoint)
    return frozenset(out)


def compute_mamba_state_set(schedule: Schedule, geometry: Geometry, prompt: Tokens, lookahead: int, block_size: int,
                            checkpoint: Tokens) -> Boundaries:
    """Return compute_mamba_states of the schedule's checkpoints as a boundary set; under the block schedule (a chunk
    end at every multiple of b_s | b, at P and at C) that is {k·b <= P} ∪ {C}, without listing the chunk ends."""
    if schedule == BLOCK_SCHEDULE:
        return make_boundaries((checkpoint,) if checkpoint > 0 else (), make_run(block_size, prompt).runs)
    return make_boundaries(compute_mamba_states(compute_checkpoints(schedule, geometry, prompt, lookahead), block_size,
                                                checkpoint))
