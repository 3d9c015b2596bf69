"""The recipes' data preparation: public-format rows in, task/SFT files out, bad rows named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    MATH_PROBLEMS,
    QA,
    VQA,
    dapo_rows,
    deepeyes_rows,
    load_script,
    retool_sft_rows,
    write_jsonl,
    write_parquet,
)

from agentloop.envs import make
from agentloop.envs.math_tool import MATH_SCHEMA, SYSTEM_PROMPT
from agentloop.envs.task_files import TaskSchema, load_tasks, write_tasks
from agentloop.errors import EnvError
from agentloop.trainers.sft_data import load_conversations


def test_retool_sft_traces_become_tool_call_conversations(retool_data: Path) -> None:
    convs = load_conversations(retool_data / "retool_sft.jsonl")  # the SFT loader's own checks
    assert len(convs) == len(MATH_PROBLEMS)
    for conv, (problem, answer, expr) in zip(convs, MATH_PROBLEMS, strict=True):
        system, user, call, tool, final = conv.messages
        assert system.content == SYSTEM_PROMPT and user.content == problem
        assert call.tool_calls[0].name == "code_interpreter"
        assert call.tool_calls[0].arguments == {"code": f"print({expr})"}
        assert call.content == "Let me compute it."
        assert tool.role == "tool" and tool.content == answer
        assert final.content.endswith(f"\\boxed{{{answer}}}") and "<answer>" not in final.content
        # the schema the SFT prompt shows is the one the RL env offers
        env = make("agentloop/MathTool-v0", files={"train": str(retool_data / "aime2024.jsonl")})
        assert list(conv.tools or []) == env.tool_schemas


def test_dapo_problems_lose_the_answer_line_template_and_are_deduplicated(
    retool_data: Path,
) -> None:
    tasks = load_tasks(retool_data / "dapo_math_17k.jsonl", MATH_SCHEMA)
    assert [t.data["prompt"] for t in tasks] == [p for p, _, _ in MATH_PROBLEMS]
    assert [t.data["answer"] for t in tasks] == [a for _, a, _ in MATH_PROBLEMS]
    assert all("Answer:" not in t.data["prompt"] for t in tasks)
    aime = load_tasks(retool_data / "aime2024.jsonl", MATH_SCHEMA)
    assert aime[0].id == "aime2024-2024-I-1" and aime[0].data["answer"] == "9"  # int -> str


def test_bad_source_rows_are_named_by_file_and_line(tmp_path: Path) -> None:
    rows = dapo_rows()
    rows[2] = {**rows[2], "reward_model": {}}
    rows[5] = {**rows[5], "prompt": "not a list"}
    src = write_jsonl(tmp_path / "dapo.jsonl", rows)
    script = load_script("retool")
    with pytest.raises(EnvError) as err:
        script._convert(script_args(script, src, skip_bad=False), tmp_path / "out")
    text = str(err.value)
    assert "2 of 12 rows cannot be converted" in text
    assert f"{src}:3: empty problem or missing reward_model.ground_truth" in text
    assert f"{src}:6: 'prompt' is not a list of chat messages" in text
    assert script.main(["--out", str(tmp_path / "out"), "--dapo", str(src)]) == 2
    assert script.main(["--out", str(tmp_path / "out"), "--dapo", str(src), "--skip-bad"]) == 0
    assert len(load_tasks(tmp_path / "out" / "dapo_math_17k.jsonl", MATH_SCHEMA)) == 6


def script_args(script: object, dapo: Path, *, skip_bad: bool) -> object:
    import argparse

    return argparse.Namespace(retool_sft=None, dapo=str(dapo), aime2024=None, aime2025=None,
                              skip_bad=skip_bad)  # fmt: skip


def test_a_retool_trace_without_interpreter_output_is_a_bad_row(tmp_path: Path) -> None:
    rows = retool_sft_rows()
    rows[1]["messages"][1]["content"] = "<code>print(1)</code> then nothing <answer>\\boxed{1}"
    src = write_jsonl(tmp_path / "sft.jsonl", rows)
    script = load_script("retool")
    assert script.main(["--out", str(tmp_path), "--retool-sft", str(src)]) == 2
    assert script.main(["--out", str(tmp_path), "--retool-sft", str(src), "--skip-bad"]) == 0
    assert len(load_conversations(tmp_path / "retool_sft.jsonl")) == len(rows) - 1


def test_search_r1_sets_are_split_by_source(search_r1_data: Path) -> None:
    env = make("agentloop/SearchR1-v0", retriever="http://127.0.0.1:1",
               files={"train": str(search_r1_data / "train.jsonl"),
                      "test": str(search_r1_data / "test.jsonl"),
                      "nq": str(search_r1_data / "test_nq.jsonl")})  # fmt: skip
    train = env.tasks("train")
    assert [t.data["prompt"] for t in train] == [q for q, _, _ in QA]
    assert [t.data["answer"] for t in train] == [g for _, g, _ in QA]
    expected = sorted(f"{s}-test-test_{i}" for i, (_, _, s) in enumerate(QA))
    assert sorted(t.id for t in env.tasks("test")) == expected
    assert [t.data["prompt"] for t in env.tasks("nq")] == [q for q, _, s in QA if s == "nq"]
    sources = {p.name for p in search_r1_data.glob("test_*.jsonl")}
    assert sources == {f"test_{s}.jsonl" for _, _, s in QA}


def test_deepeyes_rows_get_image_files_and_relative_paths(deepeyes_data: Path) -> None:
    train = [json.loads(line) for line in (deepeyes_data / "train.jsonl").open()]
    assert len(train) == 3 and all(r["image"].startswith("images/") for r in train)
    files = {"train": str(deepeyes_data / "train.jsonl"), "val": str(deepeyes_data / "val.jsonl")}
    env = make("agentloop/DeepEyes-v0", files=files)
    tasks = env.tasks("train") + env.tasks("val")
    assert sorted(t.data["answer"] for t in tasks) == sorted(a for _, a, _ in VQA)
    for task in tasks:
        assert Path(task.data["image"]).is_absolute() and Path(task.data["image"]).is_file()
        assert "<image>" not in task.data["prompt"]


def test_a_deepeyes_row_with_two_images_is_named(tmp_path: Path) -> None:
    rows = deepeyes_rows()
    rows[1]["images"] = rows[1]["images"] * 2
    src = write_parquet(tmp_path / "d.parquet", rows)
    script = load_script("deepeyes")
    assert script.main(["--out", str(tmp_path / "o"), str(src)]) == 2
    out = tmp_path / "o2"
    assert script.main(["--out", str(out), "--val-size", "1", "--skip-bad", str(src)]) == 0
    ids = [json.loads(line)["id"] for f in ("train", "val") for line in (out / f"{f}.jsonl").open()]
    assert sorted(ids) == ["deepeyes-000000", "deepeyes-000002", "deepeyes-000003"]


def test_task_file_errors_name_every_bad_row(tmp_path: Path) -> None:
    schema = TaskSchema("QA task", required={"prompt": (str,), "answer": (list,)},
                        list_of={"answer": str})  # fmt: skip
    lines = [
        json.dumps({"id": "a", "prompt": "q1", "answer": ["x"]}),
        json.dumps({"id": "b", "prompt": "q2", "answer": "x"}),
        json.dumps({"id": "a", "prompt": "q3", "answer": ["y"]}),
        json.dumps({"prompt": "q4", "answer": ["z"]}),
        json.dumps({"id": "e", "prompt": "", "answer": []}),
        json.dumps(["not", "an", "object"]),
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(EnvError) as err:
        load_tasks(path, schema)
    text = str(err.value)
    assert "5 bad QA task row(s) (of 6)" in text
    assert f"{path}:2: 'answer' is \"x\"; give a list" in text
    assert f"{path}:3: id 'a' repeats {path}:1" in text
    assert f"{path}:4: 'id' is None" in text
    assert f"{path}:5: 'prompt' is an empty string; 'answer' is []" in text
    assert f"{path}:6: the row is list" in text
    path.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(EnvError, match=r"tasks.jsonl:2 is not valid JSON"):
        load_tasks(path, schema)
    with pytest.raises(EnvError, match=r"row 0: 'answer' is missing"):
        write_tasks([{"id": "x", "prompt": "p"}], tmp_path / "w.jsonl", schema)


def test_file_backed_envs_explain_missing_files_and_splits(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match=r"reads its tasks from files: pass files="):
        make("agentloop/MathTool-v0")
    env = make("agentloop/MathTool-v0", files={"train": str(tmp_path / "nope.jsonl")})
    with pytest.raises(EnvError, match=r"split 'train': .*nope.jsonl' does not exist; run the"):
        env.tasks("train")
    with pytest.raises(EnvError, match=r"has no split 'aime2024'; its files are \['train'\]"):
        env.tasks("aime2024")
    with pytest.raises(EnvError, match=r"needs a retrieval server: set retriever=URL"):
        make("agentloop/SearchR1-v0", files={"train": "x"})
