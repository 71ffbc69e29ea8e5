"""Progress that moves while debates run (udpo.env.progress): rounds, turns, tokens, tokens/s, time left.

The logic runs on the scripted backend and a local fake OpenAI server; the hf backend's per-step token
count is checked on a tiny random model (the real model's generation code): it must equal the
completions' lengths and leave the generated text unchanged.
"""

from __future__ import annotations

import io
import threading

import pytest
from test_openai_backend import FakeServer, backend, chat_answer

from udpo.env import DebateConfig, DebateEnv, get_task
from udpo.env.backends import ChatRequest, SamplingParams
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.progress import DebateProgress, active_progress, as_progress, format_seconds, report_tokens

TASK = get_task("arithmetic")


def questions(n: int):
    return TASK.load(split="test", limit=n, seed=0)


def line(min_interval: float = 0.0) -> tuple[DebateProgress, io.StringIO]:
    out = io.StringIO()
    return DebateProgress(file=out, min_interval=min_interval), out


def test_a_debate_reports_every_round_turn_and_token():
    seen = []

    def script(request, k):
        seen.append((progress.round, progress.turns_done))  # what the line shows while the call runs
        return "I think it is \\boxed{3}."

    progress, out = line()
    env = DebateEnv(TASK, ScriptedBackend(script), DebateConfig(n_agents=3, rounds=2, debate_batch_size=2))
    trajectories = env.run(questions(3), progress=progress)
    tokens = sum(len(turn.completion_ids) for t in trajectories for row in t.turns for turn in row)
    assert progress.turns_total == progress.turns_done == 3 * 3 * 3
    assert progress.questions_done == progress.questions_total == 3
    assert progress.tokens == tokens > 0
    # batch 1 (2 questions): rounds 0, 1, 2 each start after the previous round's 6 turns
    assert [s for s in seen[:18:6]] == [(0, 0), (1, 6), (2, 12)]
    text = out.getvalue()
    for shown in ("round 0/2", "round 2/2", "batch 2/2", "27/27 turns", "tok/s", "left ~"):
        assert shown in text, shown
    progress.close()


def test_a_stopped_debate_takes_its_unrun_turns_off_the_total():
    progress, _ = line()
    config = DebateConfig(n_agents=3, rounds=3, early_stop=True)  # all agree in round 0: stop
    env = DebateEnv(TASK, ScriptedBackend(["\\boxed{4}"]), config)
    env.run(questions(2), progress=progress)
    assert progress.turns_done == progress.turns_total == 2 * 3  # round 0 only
    assert progress.eta() == (0.0, False)


def test_time_left_is_an_upper_bound_until_a_turn_finishes_then_an_estimate():
    progress = DebateProgress(enabled=False)
    progress.add_work(questions=1, turns=4, max_tokens=100)
    assert progress.eta() is None  # no token yet: no rate
    progress._started -= 10.0  # ten seconds in
    progress.add_tokens(50)  # 5 tokens/s, in the first round's call
    left, bound = progress.remaining_tokens()
    assert bound and left == 4 * 100 - 50
    assert progress.eta() == pytest.approx((350 / 5, True), rel=0.01)
    progress.finish_turns(2, generated=2, tokens=50)  # 25 tokens per turn
    left, bound = progress.remaining_tokens()
    assert not bound and left == 2 * 25
    assert "left ~" in progress.status()


def test_tokens_a_backend_did_not_report_are_counted_when_the_turns_end():
    progress = DebateProgress(enabled=False)
    progress.add_work(questions=1, turns=2, max_tokens=10)
    progress.finish_turns(2, generated=2, tokens=12)
    assert progress.tokens == 12
    progress.add_tokens(3)  # e.g. a protocol's own backend call: counts for the rate, not the turns
    progress.finish_turns(0, generated=0, tokens=0)
    assert progress.tokens == 15 and progress._tokens_of_done_turns == 12


def test_off_draws_nothing_and_backends_skip_counting(capsys):
    active = []

    def script(request, k):
        active.append(active_progress())
        return "\\boxed{1}"

    env = DebateEnv(TASK, ScriptedBackend(script), DebateConfig(n_agents=2, rounds=1))
    env.run(questions(2), progress=False)
    assert set(active) == {None}
    assert capsys.readouterr().err == ""


def test_on_draws_to_stderr_and_closes_its_own_line(capsys):
    env = DebateEnv(TASK, ScriptedBackend(["\\boxed{1}"]), DebateConfig(n_agents=2, rounds=1))
    env.run(questions(2), progress=True)
    err = capsys.readouterr().err
    assert "debate" in err and "8/8 turns" in err and "q 2/2" in err


def test_one_line_spans_several_runs_and_reset_starts_over():
    progress, _ = line()
    env = DebateEnv(TASK, ScriptedBackend(["\\boxed{1}"]), DebateConfig(n_agents=2, rounds=1))
    env.run(questions(2), progress=progress)
    env.run(questions(3), progress=progress)
    assert progress.turns_done == progress.turns_total == 5 * 4
    assert progress.questions_done == 5
    progress.reset(desc="rollout 2")
    assert (progress.turns_total, progress.tokens, progress.desc) == (0, 0, "rollout 2")
    env.run(questions(1), progress=progress)
    assert progress.turns_done == progress.turns_total == 4
    progress.close()
    progress.close()  # twice is fine


def test_as_progress_owns_only_what_it_makes():
    mine = DebateProgress(enabled=False)
    assert as_progress(mine) == (mine, False)
    made, owned = as_progress(False)
    assert owned and not made.enabled


def test_report_tokens_reaches_only_the_counting_line():
    progress = DebateProgress(enabled=True, file=io.StringIO())
    report_tokens(5)  # nobody counting: ignored
    with progress.counting():
        report_tokens(7)
        threads = [threading.Thread(target=progress.add_tokens, args=(1,)) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    report_tokens(9)
    assert progress.tokens == 27
    quiet = DebateProgress(enabled=False)
    with quiet.counting():
        assert active_progress() is None  # a disabled line asks backends for nothing
    progress.close()


def test_format_seconds():
    assert [format_seconds(s) for s in (0, 59.6, 61, 3725)] == ["0:00", "1:00", "1:01", "1:02:05"]


def test_openai_backend_reports_each_response_from_its_worker_threads():
    with FakeServer(lambda path, body: (200, chat_answer("hi"), {})) as server:
        engine = backend(server.url, max_concurrency=3)
        progress = DebateProgress(enabled=True, file=io.StringIO())
        with progress.counting():
            engine.generate([ChatRequest([{"role": "user", "content": "q"}]) for _ in range(5)])
        progress.close()
    assert progress.tokens == 5 * 2  # no token ids from this server: its two log-probs per answer


def test_hf_backend_counts_tokens_per_step_without_changing_the_output(tiny_model):
    from udpo.env.backends.hf import HFBackend

    hf_backend = HFBackend(model=tiny_model, dtype="fp32")
    requests = [
        ChatRequest(
            [{"role": "user", "content": f"What is {k} + {k}?"}], SamplingParams(temperature=0, max_tokens=24)
        )
        for k in range(3)
    ]
    try:
        plain = hf_backend.generate(requests)
        progress = DebateProgress(enabled=True, file=io.StringIO(), min_interval=0)
        with progress.counting():
            counted = hf_backend.generate(requests)
        progress.close()
    finally:
        hf_backend.close()
    assert [c.completion_ids for c in counted] == [c.completion_ids for c in plain]
    assert progress.tokens == sum(len(c.completion_ids) for c in counted)
