"""A CPU-time budget per answer: an input that would take longer is refused by a named limit, under any load.

`kvspec explain` answers every accepted scenario in well under a second (spec/limits.py bounds the inputs;
past the explicit limit the spec works on runs and points). The budget is the backstop for what the
limits do not foresee: each scenario — one `explain`, one `--scenarios` line — may use `CPU_BUDGET_S` of
this process's CPU time (ITIMER_PROF: user + system, not wall time, so a loaded machine neither fails a
cheap input nor lets an expensive one through); past it the answer is `limit-cpu`, exit 2 (a line's
error object with --scenarios, whose other lines are still answered).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from kvspec.spec.errors import SpecError

CPU_BUDGET_S = 1.5  # CPU seconds per answer (the hostile-input contract: every answer within 2 s of CPU)
RULE_LIMIT_CPU = "limit-cpu"
REFIRE_S = 0.01  # CPU seconds between a raise Python dropped and the next one


@contextlib.contextmanager
def limit_cpu(what: str, seconds: float | None = None) -> Iterator[None]:
    """Run the block; raise SpecError(limit-cpu) inside it once it has used `seconds` (default CPU_BUDGET_S) of CPU
    time (main thread on a system with setitimer; elsewhere the block runs unbounded)."""
    seconds = CPU_BUDGET_S if seconds is None else seconds
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    message = (f"{what} used more than {seconds} s of CPU time, the budget of one answer (checks/cli/budget.py): a smaller "
               f"scenario, or one past the explicit limit (answered on runs), is answered")
    fired: list[bool] = []
    active = True

    def expire(signum: int, frame: FrameType | None) -> None:
        if not active:  # the block has ended: a tick that lands while the timer is being disarmed raises nothing
            return
        fired.append(True)
        # the signal may land where Python cannot raise (a gc callback, a __del__: the exception is printed and
        # dropped): the timer fires again a tick later, until a raise reaches the block
        signal.setitimer(signal.ITIMER_PROF, REFIRE_S)
        raise SpecError(RULE_LIMIT_CPU, message)

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        active = False  # first, by a plain store (Python runs a signal handler only at calls and loops)
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    # a block that ended between a dropped raise and the next one is refused all the same
    if fired:
        raise SpecError(RULE_LIMIT_CPU, message)
