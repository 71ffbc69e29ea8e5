"""Progress that moves while debates run: rounds, agents' turns, generated tokens, tokens/s, time left.

A batch of debates finishes all at once (every round is one backend call for all its questions), so a
bar that counts finished questions stands still for minutes on a CPU. :class:`DebateProgress` counts the
work underneath instead:

- :class:`~udpo.env.debate.DebateEnv` reports the batch, the round (``round r/T``) and the agents'
  turns as each round's backend call returns;
- backends report the completion tokens they generate through :func:`report_tokens`: the ``hf`` backend
  once per decoding step (a stopping criterion that never stops), ``vllm`` per engine call, ``openai``
  per response. Outside :meth:`DebateProgress.counting` (and with a disabled reporter) the call does
  nothing and backends skip the counting entirely.

The line it draws (tqdm; at most every ``min_interval`` seconds)::

    debate:  33%|███▎      | 18/54 turns [01:02, q 0/6, round 2/3, 1.9k tok, 30.1 tok/s, left ~2:05]

``left`` is the remaining token budget over the tokens/s measured so far. Before any turn has finished
the budget is ``max_tokens`` per remaining turn, an upper bound shown as ``left <=``; afterwards it is
the mean tokens of the finished turns per remaining turn, an estimate shown as ``left ~``.

One reporter can span several ``DebateEnv.run`` calls (the rows of ``udpo eval``, the runs of a
comparison): each call adds its work to the totals. :meth:`DebateProgress.reset` starts it over (a
training loop's rollout of each iteration).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO

from tqdm.auto import tqdm

__all__ = ["DebateProgress", "active_progress", "as_progress", "format_seconds", "report_tokens"]

_ACTIVE: ContextVar[DebateProgress | None] = ContextVar("udpo_debate_progress", default=None)

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} turns [{elapsed}{postfix}]"


def active_progress() -> DebateProgress | None:
    """The reporter counting tokens in this context (None: nobody is counting; backends skip the work).

    Backends that generate in worker threads read it in the calling thread and pass it on."""
    return _ACTIVE.get()


def report_tokens(n: int) -> None:
    """A backend generated ``n`` completion tokens (of any rows of its current call)."""
    progress = _ACTIVE.get()
    if progress is not None and n > 0:
        progress.add_tokens(n)


def format_seconds(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _count(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


class DebateProgress:
    """Counts and shows the work of debates as it happens (see the module docstring).

    desc: the label of the line. enabled: draw it (False: count turns and questions only; backends do
    not count tokens). leave: keep the finished line on screen. position: tqdm line (1 draws below a
    bar at line 0, e.g. the training loop's). file: where to draw (default stderr). min_interval: seconds
    between redraws caused by tokens (default 0.5 on a terminal, 30 when the output is a file or pipe).

    Thread-safe: backends may report tokens from worker threads.
    """

    def __init__(
        self,
        desc: str = "debate",
        enabled: bool = True,
        leave: bool = True,
        position: int | None = None,
        file: IO[str] | None = None,
        min_interval: float | None = None,
    ):
        self.desc = desc
        self.enabled = enabled
        self.leave = leave
        self.position = position
        self.file = file
        if min_interval is None:
            stream = file if file is not None else sys.stderr
            min_interval = 0.5 if getattr(stream, "isatty", lambda: False)() else 30.0
        self.min_interval = min_interval
        self._lock = threading.RLock()
        self._bar: tqdm | None = None
        self._zero()

    def _zero(self) -> None:
        self.questions_total = 0
        self.questions_done = 0
        self.correct = 0
        self.turns_total = 0
        self.turns_done = 0
        self.tokens = 0
        self.max_tokens = 0
        self.round: int | None = None
        self.rounds: int | None = None
        self.batch: tuple[int, int] | None = None
        self._tokens_of_done_turns = 0  # completion tokens of the turns that have finished
        self._mark = 0  # self.tokens when turns last finished: later tokens belong to turns under way
        self._generated_turns = 0  # finished turns that a backend generated (not supplied or injected)
        self._started: float | None = None
        self._last_draw = 0.0

    # the work ----------------------------------------------------------------------------------
    def add_work(self, questions: int, turns: int, max_tokens: int) -> None:
        """``questions`` more debates of at most ``turns`` agent turns, each of at most ``max_tokens``."""
        with self._lock:
            self.questions_total += questions
            self.turns_total += turns
            self.max_tokens = max(self.max_tokens, max_tokens)
            if self._started is None:
                self._started = time.monotonic()
            if self._bar is not None:
                self._bar.total = self.turns_total
            elif self.enabled:
                self._bar = tqdm(
                    total=self.turns_total,
                    desc=self.desc,
                    leave=self.leave,
                    position=self.position,
                    file=self.file,
                    bar_format=BAR_FORMAT,
                    dynamic_ncols=True,
                    mininterval=self.min_interval,
                )
            self._draw()

    def start_batch(self, index: int, count: int) -> None:
        """Batch ``index`` (0-based) of ``count`` begins."""
        with self._lock:
            self.batch = (index, count)
            self.round = None
            self._draw()

    def start_round(self, round: int, rounds: int) -> None:
        """Round ``round`` of ``0..rounds`` begins (its backend call is about to run)."""
        with self._lock:
            self.round, self.rounds = round, rounds
            self._draw()

    def add_tokens(self, n: int) -> None:
        """``n`` completion tokens were generated (called by backends, possibly from other threads)."""
        with self._lock:
            self.tokens += n
            if self._bar is not None and time.monotonic() - self._last_draw >= self.min_interval:
                self._draw()

    def finish_turns(self, n: int, generated: int, tokens: int) -> None:
        """``n`` turns ended, ``generated`` of them by the backend, with ``tokens`` completion tokens in all.

        Tokens the backend did not report as it went (a backend without :func:`report_tokens`) are
        counted now; tokens it reported beyond these (other calls of the round, e.g. a protocol's
        rewrites) still count towards the rate."""
        with self._lock:
            self.turns_done += n
            self._generated_turns += generated
            self._tokens_of_done_turns += tokens
            self.tokens = max(self.tokens, self._mark + tokens)
            self._mark = self.tokens
            self._draw()

    def skip_turns(self, n: int) -> None:
        """``n`` planned turns will not run (agents or debates that stopped early)."""
        with self._lock:
            self.turns_total -= n
            if self._bar is not None:
                self._bar.total = self.turns_total
            self._draw()

    def finish_questions(self, n: int, correct: int) -> None:
        """``n`` debates ended, ``correct`` of them with the right team answer."""
        with self._lock:
            self.questions_done += n
            self.correct += correct
            self._draw()

    # what it shows -----------------------------------------------------------------------------
    @property
    def elapsed(self) -> float:
        """Seconds since the first work was added."""
        return 0.0 if self._started is None else time.monotonic() - self._started

    @property
    def tokens_per_second(self) -> float | None:
        """Completion tokens per second of wall time so far (None before any token)."""
        elapsed = self.elapsed
        return self.tokens / elapsed if self.tokens and elapsed > 0 else None

    def remaining_tokens(self) -> tuple[float, bool]:
        """(tokens still to generate, whether that is an upper bound rather than an estimate)."""
        left = self.turns_total - self.turns_done
        in_flight = self.tokens - self._mark
        if self._generated_turns:
            per_turn, bound = self._tokens_of_done_turns / self._generated_turns, False
        else:
            per_turn, bound = float(self.max_tokens), True
        return max(0.0, left * per_turn - in_flight), bound

    def eta(self) -> tuple[float, bool] | None:
        """(seconds left, whether an upper bound) from the remaining tokens and the rate; None unknown."""
        rate = self.tokens_per_second
        if self.turns_done >= self.turns_total and self.turns_total:
            return 0.0, False
        if rate is None:
            return None
        left, bound = self.remaining_tokens()
        return left / rate, bound

    def status(self) -> str:
        """The fields shown after the bar: questions, batch, round, tokens, tokens/s, time left."""
        parts = [f"q {self.questions_done}/{self.questions_total}"]
        if self.questions_done:
            parts.append(f"acc {self.correct / self.questions_done:.2f}")
        if self.batch is not None and self.batch[1] > 1:
            parts.append(f"batch {self.batch[0] + 1}/{self.batch[1]}")
        if self.round is not None and self.rounds is not None:
            parts.append(f"round {self.round}/{self.rounds}")
        parts.append(f"{_count(self.tokens)} tok")
        rate = self.tokens_per_second
        if rate is not None:
            parts.append(f"{rate:.1f} tok/s")
        eta = self.eta()
        if eta is not None:
            seconds, bound = eta
            parts.append(f"left {'<=' if bound else '~'}{format_seconds(seconds)}")
        return ", ".join(parts)

    def _draw(self) -> None:
        if self._bar is None:
            return
        self._last_draw = time.monotonic()
        self._bar.n = self.turns_done
        self._bar.set_postfix_str(self.status(), refresh=True)

    # lifetime ----------------------------------------------------------------------------------
    @contextmanager
    def counting(self) -> Iterator[DebateProgress]:
        """Within the block, backends' :func:`report_tokens` calls reach this reporter (when enabled)."""
        if not self.enabled:
            yield self
            return
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def reset(self, desc: str | None = None) -> None:
        """Zero every count (and optionally relabel) to report a new piece of work on the same line."""
        with self._lock:
            self._zero()
            if desc is not None:
                self.desc = desc
            if self._bar is not None:
                self._bar.reset(total=0)
                self._bar.set_description_str(self.desc, refresh=False)

    def close(self) -> None:
        """Draw the final state and release the line. Safe to call twice."""
        with self._lock:
            if self._bar is not None:
                self._draw()
                self._bar.close()
                self._bar = None

    def __enter__(self) -> DebateProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def as_progress(progress: bool | DebateProgress | None, desc: str = "debate") -> tuple[DebateProgress, bool]:
    """(the reporter to use, whether the caller created it and must close it) for a ``progress``
    argument: a DebateProgress is used as given; True / False / None make a new one, drawn or not."""
    if isinstance(progress, DebateProgress):
        return progress, False
    return DebateProgress(desc=desc, enabled=bool(progress)), True
