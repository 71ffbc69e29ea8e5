"""Multi-step procedures over item batches that are not Standard MAD rounds (ColMAD and its baselines,
DiverseAgentEntropy): the shared batching, backend calls and progress bar.

A procedure handles a batch of questions step by step; each step sends every request of the whole
batch (all items, all agents) to the backend in one ``generate`` call, so a CPU run pays one padded
forward pass per step, not one per item. Each finished item becomes a :class:`Trajectory`, written to
an append-only JSONL file batch by batch, so ``udpo diagnose`` and resumption read the same files as
for debates.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from tqdm.auto import tqdm

from ..backends.base import Backend, ChatRequest, Completion, SamplingParams
from ..debate import AgentSpec
from ..tasks.base import Question, Task
from ..tasks.parsing import Reading
from ..trajectory import Trajectory, TrajectoryWriter, Turn


def chat(system: str | None, user: str) -> list[dict[str, str]]:
    """A two-message conversation (the system message left out when empty)."""
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": user}]


def request(spec: AgentSpec, messages: list[dict[str, str]], sampling: SamplingParams) -> ChatRequest:
    """A request for an agent: its adapter and model, its own sampling if it has one, else ``sampling``."""
    return ChatRequest(
        messages=[dict(m) for m in messages],
        sampling=spec.sampling or sampling,
        adapter=spec.adapter,
        model=spec.model,
    )


def generate(backend: Backend, requests: Sequence[ChatRequest]) -> list[Completion]:
    """One backend call for all ``requests`` (none when there are none), checked for one reply each."""
    if not requests:
        return []
    completions = backend.generate(list(requests))
    if len(completions) != len(requests):
        raise RuntimeError(f"backend returned {len(completions)} completions for {len(requests)} requests")
    return completions


def make_turn(agent: int, rnd: int, req: ChatRequest, completion: Completion, reading: Reading) -> Turn:
    """The trajectory record of one generated reply and its answer as the task read it."""
    return Turn(
        agent=agent,
        round=rnd,
        messages=req.messages,
        text=completion.text,
        answer=reading.answer,
        form=reading.form,
        prompt_ids=completion.prompt_ids,
        completion_ids=completion.completion_ids,
        logprobs=completion.logprobs,
        adapter=req.adapter,
        finish_reason=completion.finish_reason,
    )


class Procedure(abc.ABC):
    """A protocol that turns a batch of questions into trajectories (see the module docstring).

    Subclasses set ``name`` and implement :meth:`run_batch`; ``meta`` is copied into every trajectory.
    """

    name: str = "procedure"

    def __init__(self, task: Task, backend: Backend, batch_size: int = 16, meta: dict | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.task = task
        self.backend = backend
        self.batch_size = batch_size
        self.meta = dict(meta or {})
        self._bar: tqdm | None = None

    @abc.abstractmethod
    def run_batch(self, questions: list[Question]) -> list[Trajectory]:
        """Trajectories of a batch of questions, in order."""

    def run(
        self, questions: Sequence[Question], writer: TrajectoryWriter | None = None, progress: bool = True
    ) -> list[Trajectory]:
        """Every question, batch by batch; each finished batch is appended to ``writer``."""
        out: list[Trajectory] = []
        bar = self._bar = tqdm(total=len(questions), desc=self.name, unit="q", disable=not progress)
        try:
            for start in range(0, len(questions), self.batch_size):
                batch = self.run_batch(list(questions[start : start + self.batch_size]))
                if writer is not None:
                    writer.write(batch)
                out.extend(batch)
                bar.update(len(batch))
                bar.set_postfix(acc=f"{sum(t.correct for t in out) / len(out):.2f}")
        finally:
            bar.close()
            self._bar = None
        return out

    def stage(self, step: str) -> None:
        """Show the step the current batch is in on the progress bar (a CPU batch step can take minutes)."""
        if self._bar is not None:
            self._bar.set_description(f"{self.name} [{step}]")

    def trajectory(
        self,
        question: Question,
        answers: list[list],
        prediction,
        turns: list[list[Turn]],
        **meta,
    ) -> Trajectory:
        """A finished item: its answer matrix, prediction, turns, and run + item metadata."""
        item = {k: question.meta[k] for k in ("subtask", "response_model", "columns") if k in question.meta}
        return Trajectory(
            question_id=question.id,
            question=question.text,
            gold=question.gold,
            answers=answers,
            prediction=prediction,
            correct=self.task.is_correct(prediction, question),
            turns=turns,
            meta={"task": self.task.name, "protocol": self.name, **item, **meta, **self.meta},
        )
