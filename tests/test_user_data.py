"""Users' data read right the first time (issue 51): GSM8K as published (``answer`` = a worked solution
ending ``#### 72``), a slip among numeric golds, a ``datasets.DatasetDict``, TRL's ``prompt`` and chat
``messages`` columns, and every field of a record carried to the debate's trajectory."""

from __future__ import annotations

import dataclasses
import json

import pytest

import udpo
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.tasks import get_task
from udpo.env.tasks.custom import DatasetTask
from udpo.env.tasks.data import DataError
from udpo.env.tasks.gsm8k import GSM8K

#: two records of GSM8K's train split, in its published layout (question, answer = solution + "#### N")
GSM8K_RECORDS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
        "May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
        "altogether in April and May.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
        "How much did she earn?",
        "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
        "$<<0.2*50=10>>10.\n#### 10",
    },
]


def test_gsm8k_as_published_is_a_numeric_task_and_says_so(capsys):
    task = DatasetTask(train=GSM8K_RECORDS)
    assert task.answer_format == "number"
    assert [q.gold for q in task.load("train")] == ["72", "10"]
    said = capsys.readouterr().err
    assert said.count("answer format 'number'") == 1
    assert "all 2 gold answers are numbers (2 of them worked solutions ending '#### <number>'" in said
    assert (
        "split train, record 0: 'Natalia sold 48/2 = <<48/2=24>> ... ther in April and May.\\n#### 72' read as '72'"
        in said
    )
    # given the format, or as text, the "#### N" ending is still what is compared
    assert [q.gold for q in DatasetTask(train=GSM8K_RECORDS, answer_format="text").load("train")] == [
        "72",
        "10",
    ]
    assert capsys.readouterr().err == ""  # a format given is not announced


def test_gsm8k_as_published_through_every_entry_point(tmp_path, capsys):
    """The trainer's datasets, a JSONL file, a recipe's task options, a team's questions: gold 72."""
    from udpo.api import _task_settings

    args = udpo.UDPOConfig(output_dir=str(tmp_path / "run"))
    config = dataclasses.replace(args, **_task_settings(args, None, GSM8K_RECORDS, GSM8K_RECORDS[:1]))
    trained = get_task(config.task)
    assert [q.gold for q in trained.load(config.eval_split)] == ["72"]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_RECORDS))
    assert [q.gold for q in DatasetTask(train=str(path)).load("train")] == ["72", "10"]
    udpo.register_task("gsm8k-mine", DatasetTask)  # a recipe: task: gsm8k-mine, task_options: {train: ...}
    assert [q.gold for q in get_task("gsm8k-mine", train=str(path)).load("train")] == ["72", "10"]
    assert capsys.readouterr().err.count("answer format 'number'") == 3


def test_the_published_gsm8k_file_reads_as_the_gsm8k_task_reads_it(shared_data):
    path = f"{shared_data}/gsm8k/test.jsonl"
    mine = DatasetTask(test=path).load("test")
    builtin = GSM8K().load("test", data_path=path)
    assert len(mine) == len(builtin) == 1319
    assert [q.gold for q in mine] == [q.gold for q in builtin]


def test_one_slip_among_numbers_is_refused_with_the_record_and_the_ways_out():
    records = [{"question": f"q{k}", "answer": k} for k in range(5)]
    records.insert(3, {"question": "How many apples?", "answer": "5 apples"})
    with pytest.raises(DataError) as e:
        DatasetTask(train=records)
    message = str(e.value)
    assert message.startswith("task dataset, split train, record 3: answer '5 apples' is not a number")
    assert "5 of the 6 gold answers are" in message
    assert "write it as a number alone" in message and "answer_format='text'" in message
    assert DatasetTask(train=records, answer_format="text").load("train")[3].gold == "5 apples"
    # as many texts as numbers: a text task, said with the first answer that is no number
    assert DatasetTask(train=records[3:5]).answer_format == "text"


def test_a_dataset_dict_is_answered_with_its_split_names():
    datasets = pytest.importorskip("datasets")
    data = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(GSM8K_RECORDS),
            "test": datasets.Dataset.from_list(GSM8K_RECORDS[:1]),
        }
    )
    with pytest.raises(DataError, match=r"dict of splits \('train', 'test'\).*train_dataset=data\['train'\]"):
        DatasetTask(train=data)
    with pytest.raises(DataError, match=r"DatasetTask\(splits=data\)"):
        udpo.UDPOTrainer(args=udpo.UDPOConfig(output_dir="unused"), train_dataset=data)
    task = DatasetTask(splits=data)
    assert task.splits == ("train", "test") and [q.gold for q in task.load("test")] == ["72"]
    with pytest.raises(DataError, match=r"not one dict \(keys: 'question', 'answer'\)"):
        DatasetTask(train=GSM8K_RECORDS[0])


def test_trl_prompt_and_chat_messages_columns_are_pointed_to_question_field():
    trl_style = [{"prompt": "What is 2 + 3?", "answer": "5"}]
    with pytest.raises(DataError, match="no 'question' field.*pass question_field='prompt'"):
        DatasetTask(train=trl_style)
    assert (
        DatasetTask(train=trl_style, question_field="prompt")
        .load("train")[0]
        .text.startswith("What is 2 + 3?")
    )
    chat = [
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2 + 3?"},
                {"role": "assistant", "content": "5"},
            ],
            "solution": "5",
        }
    ]
    with pytest.raises(DataError, match="pass question_field='messages'"):
        DatasetTask(train=chat, answer_field="solution")
    with pytest.raises(DataError, match="no 'answer' field.*pass answer_field='solution'"):
        DatasetTask(train=chat, question_field="messages")
    question = DatasetTask(train=chat, question_field="messages", answer_field="solution").load("train")[0]
    assert question.text == "What is 2 + 3?" and question.gold == "5"
    with pytest.raises(DataError, match="'messages' must be a non-empty string or a conversation"):
        DatasetTask(
            train=[{"messages": [{"role": "system", "content": "x"}], "answer": "1"}],
            question_field="messages",
        )


def test_every_field_of_a_record_reaches_the_debate_trajectory():
    records = [dict(r, level=k, tags=["arithmetic"]) for k, r in enumerate(GSM8K_RECORDS)]
    task = DatasetTask(train=records)
    questions = task.load("train")
    assert [q.meta["columns"] for q in questions] == records
    env = DebateEnv(task, ScriptedBackend(["\\boxed{72}"]), DebateConfig(n_agents=2, rounds=1))
    trajectories = env.run(questions, progress=False)
    assert [t.meta["columns"] for t in trajectories] == records
    assert trajectories[0].correct and not trajectories[1].correct
    with pytest.raises(DataError, match=r"record 0: field 'when' holds a set.*remove_columns\(\['when'\]\)"):
        DatasetTask(train=[{"question": "q", "answer": 1, "when": {1, 2}}])
