"""The Search-R1 demo's world and scripted expert: answers need retrieval; traces score right."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from agentloop.envs.search_r1_traces import (
    SearchTraceConfig,
    make_search_traces,
    search_world,
    write_search_world,
)
from agentloop.errors import EnvError
from agentloop.tools.search import FakeRetriever, Passage


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    out = tmp_path_factory.mktemp("world")
    return out, write_search_world(search_world(600, seed=3, two_hop_rate=0.5, num_test=40), out)


def test_world_questions_are_answered_by_their_passages_only() -> None:
    world = search_world(600, seed=3, two_hop_rate=0.5, num_test=40)
    assert world == search_world(600, seed=3, two_hop_rate=0.5, num_test=40)  # deterministic
    text = {d["title"]: d["text"] for d in world.corpus}
    train, test = world.splits["train"], world.splits["test"]
    assert len(test) == 40 and {r["source"] for r in train} == {"1hop", "2hop"}
    for row in (*train, *test):
        person, city = row["hops"][-1], row["answer"][0]
        assert re.fullmatch(r"person \d{4}", person) and re.fullmatch(r"\d{4}", city)
        assert text[person] == f"P{person[1:]} was born in city {city}."
        if row["source"] == "2hop":
            assert row["hops"][0] in row["prompt"] and f"by {person}." in text[row["hops"][0]]
        else:
            assert row["prompt"] == f"In which city was {person} born?"
    # held out: no person of the test questions is asked about in training
    assert not {r["hops"][-1] for r in test} & {r["hops"][-1] for r in train}
    cities = {r["answer"][0] for r in train}
    assert len(cities) > 40  # a guess is right about 1 time in 40 or less
    codes = [t.split()[1] for t in text] + list(cities)
    assert len(codes) == len(set(codes))  # no code names two things: a search finds one passage
    with pytest.raises(EnvError, match="num_test"):
        search_world(600, num_test=0)


def test_expert_traces_search_read_and_answer(world_dir: tuple[Path, dict[str, Path]]) -> None:
    _, paths = world_dir
    corpus = [Passage(**row) for row in _rows(paths["corpus"])]
    files = {"train": str(paths["train"]), "test": str(paths["test"])}
    # topk=2: the fake ranks by shared words, so a founder's company passage ties with his own
    config = SearchTraceConfig(
        files=files, retriever=FakeRetriever(corpus), num_traces=30, num_compact=5,
        guess_rate=0.2, typo_rate=0.1, topk=2,
    )  # fmt: skip
    rows = asyncio.run(make_search_traces(config))
    assert rows == asyncio.run(make_search_traces(config))
    assert len(rows) == 35 and sum(1 for r in rows if "tools" in r) == 30
    episodes = sum(len(r["task_ids"]) for r in rows)
    assert episodes == config.num_episodes == 50
    scored = sum(r["reward"] * len(r["task_ids"]) for r in rows)
    assert scored == pytest.approx(episodes - 10 - 5)  # every guess and typo is wrong
    for row in rows:
        if "tools" not in row:
            continue
        messages = row["messages"]
        calls = [c for m in messages for c in m.get("tool_calls", [])]
        answer = re.fullmatch(r"<answer>(\w+)</answer>", messages[-1]["content"])
        assert answer is not None
        if row["reward"] == 1.0:  # searched the question's name, read the city from the passage
            assert calls and calls[0]["function"]["arguments"]["query"] in messages[1]["content"]
            assert f"born in city {answer[1]}." in messages[-2]["content"]
        elif not calls:
            assert answer[1] != row["answers"][0][0]


def test_trace_config_names_bad_rates() -> None:
    with pytest.raises(EnvError, match=r"guess_rate=0\.8 and typo_rate=0\.5"):
        SearchTraceConfig(files={}, retriever="http://x", guess_rate=0.8, typo_rate=0.5)


def _rows(path: Path) -> list[dict[str, str]]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]
