"""SearchQA-v0: gymnasium conformance, gold answers, EM/F1, an episode through the search tool."""

from __future__ import annotations

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from agentloop.envs import exact_match, f1_score, make, normalize_answer
from agentloop.envs.search_qa import searchqa_corpus, searchqa_reward, searchqa_tasks
from agentloop.tools.search import FakeRetriever
from agentloop.types import Message, ToolCall


def test_check_env_passes_for_search_qa() -> None:
    env = gymnasium.make("agentloop/SearchQA-v0")
    check_env(env.unwrapped)
    env.close()


def test_em_and_f1() -> None:
    assert normalize_answer("The  Velkor, Systems!") == "velkor systems"
    assert exact_match("the Velkor systems", ["x", "Velkor Systems"])
    assert not exact_match(None, "a") and not exact_match("Velkor", "Velkor Systems")
    assert f1_score("Velkor", "Velkor Systems") == pytest.approx(2 / 3)
    assert f1_score("Velkor Systems", ["nope", "velkor systems"]) == 1.0
    assert f1_score("", "x") == 0.0 and f1_score(None, "x") == 0.0


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_verifier_accepts_its_gold_answer_and_rejects_a_wrong_one(split: str) -> None:
    tasks = searchqa_tasks(split)
    answers = sorted({t.data["answer"] for t in tasks})
    assert len(tasks) > 50 and len(answers) > 10
    for task in tasks:
        gold = task.data["answer"]
        right = searchqa_reward(task, [Message("assistant", f"So: \\boxed{{The {gold}}}")])
        assert right.value == 1.0 and right.metrics["f1"] == 1.0
        wrong = next(a for a in answers if normalize_answer(a) != normalize_answer(gold))
        miss = searchqa_reward(task, [Message("assistant", f"\\boxed{{{wrong}}}")])
        assert miss.value == 0.0 and miss.metrics["has_boxed"] == 1.0
        assert searchqa_reward(task, [Message("assistant", gold)]).value == 0.0


def test_tasks_are_answerable_from_the_corpus() -> None:
    corpus = {p.id: p for p in searchqa_corpus()}
    for task in searchqa_tasks("train") + searchqa_tasks("test"):
        hops = task.data["hops"]
        assert 2 <= len(hops) <= 3
        for hop in hops:
            assert hop["query"] in corpus[hop["doc_id"]].text
        assert task.data["answer"] in corpus[hops[-1]["doc_id"]].text
    assert not {t.data["prompt"] for t in searchqa_tasks("train")} & {
        t.data["prompt"] for t in searchqa_tasks("test")
    }


async def test_an_episode_searches_hop_by_hop() -> None:
    env = make("agentloop/SearchQA-v0", retriever=FakeRetriever(searchqa_corpus()))
    task = searchqa_tasks("test")[0]
    await env.reset(options={"task": task})
    for hop in task.data["hops"]:
        call = ToolCall("search", {"query": hop["query"], "topk": 2}, id=hop["doc_id"])
        result = await env.step(Message("assistant", "<tool_call>…</tool_call>", (call,)))
        (obs,) = result.observation
        assert hop["query"] in obs.content and obs.content.startswith("Doc 1 (")
    final = await env.step(Message("assistant", f"\\boxed{{{task.data['answer']}}}"))
    assert final.terminated and final.reward == 1.0
    assert final.metrics["search_calls"] == len(task.data["hops"])
    await env.close()
