"""``du-arithmetic``: Du et al.'s arithmetic items, regenerated as their public generator draws them.

Their ``math/gen_math.py`` (composable-models/llm_multiagent_debate) runs ``np.random.seed(0)``, then
100 times ``a, b, c, d, e, f = np.random.randint(0, 30, size=6)`` with answer ``a + b * c + d - e * f``
and asks "What is the result of {}+{}*{}+{}-{}*{}?". The first items are pinned as literals below
(read off that generator) and the whole set is checked against the same global-NumPy procedure.
"""

from __future__ import annotations

import numpy as np
import pytest

from udpo.env.tasks import TASK_NAMES, get_task

#: (a, b, c, d, e, f), answer: the generator's first items and its 100th
PUBLISHED = {
    0: ((12, 15, 21, 0, 3, 27), 246),
    1: ((3, 7, 9, 19, 21, 18), -293),
    2: ((4, 23, 6, 24, 24, 12), -122),
    3: ((26, 1, 6, 7, 23, 14), -283),
    4: ((24, 17, 5, 25, 13, 8), 30),
    99: ((24, 26, 4, 3, 5, 6), 101),
}


def test_first_items_are_the_published_ones():
    questions = get_task("du-arithmetic").load()
    assert len(questions) == 100 and "du-arithmetic" in TASK_NAMES
    for k, (ops, answer) in PUBLISHED.items():
        q = questions[k]
        assert q.id == f"du-arithmetic-{k}"
        assert q.text == "What is the result of {}+{}*{}+{}-{}*{}?".format(*ops)
        assert q.gold == str(answer) and q.meta["operands"] == list(ops)


def test_every_item_matches_the_generators_procedure():
    """The script's own steps, on NumPy's global legacy generator (its state restored afterwards)."""
    saved = np.random.get_state()
    try:
        np.random.seed(0)
        expected = []
        for _ in range(100):
            a, b, c, d, e, f = np.random.randint(0, 30, size=6)
            expected.append((f"What is the result of {a}+{b}*{c}+{d}-{e}*{f}?", a + b * c + d - e * f))
    finally:
        np.random.set_state(saved)
    got = [(q.text, int(q.gold)) for q in get_task("du-arithmetic").load()]
    assert got == [(text, int(answer)) for text, answer in expected]


def test_splits_limits_and_parsing():
    task = get_task("du-arithmetic", n_questions=150)
    longer = task.load()
    assert [q.text for q in longer[:100]] == [q.text for q in get_task("du-arithmetic").load()]
    assert task.load(limit=3) == longer[:3] and task.load(seed=7) == longer  # the items are theirs
    train = get_task("du-arithmetic", n_questions=200).load("train")
    assert len(train) == 200 and train[0].id == "du-arithmetic-1000"
    assert not {q.text for q in train} & {q.text for q in get_task("du-arithmetic", n_questions=1000).load()}
    q = longer[0]
    assert task.is_correct(task.parse("so the result is \\boxed{246}", q), q)
    with pytest.raises(ValueError, match="no data path is read"):
        task.load(data_path="x.jsonl")
    with pytest.raises(ValueError, match="unknown split"):
        task.load("dev")
