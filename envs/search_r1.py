"""agentloop/SearchR1-v0: open-domain QA from task files with a search tool over a retrieval server.

The Search-R1 setting: NQ + HotpotQA for training, seven QA sets for evaluation (NQ, TriviaQA,
PopQA, HotpotQA, 2WikiMultihopQA, Musique, Bamboogle), Wikipedia passages served by a
retrieval server speaking Search-R1's ``/retrieve`` protocol (``agentloop serve-search``, or
Search-R1's own server). ``recipes/search_r1/prepare_data.py`` converts the public parquet
files. The reward is exact match of the final answer (``<answer>…</answer>`` or ``\\boxed{}``)
with any gold answer, SQuAD-normalized; F1 and search use are metrics only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from agentloop.envs.rewards import (
    Reward,
    exact_match,
    extract_final_answer,
    f1_score,
    last_assistant_text,
)
from agentloop.envs.task_files import TaskFiles, TaskSchema
from agentloop.envs.tool_env import ToolEnv
from agentloop.errors import EnvError
from agentloop.tools.search import Retriever, search_tool
from agentloop.types import Message, Task

__all__ = ["QA_SCHEMA", "SEARCH_URL_ENV", "SYSTEM_PROMPT", "SearchR1Env", "search_r1_reward"]

SEARCH_URL_ENV = "AGENTLOOP_SEARCH_URL"
SYSTEM_PROMPT = (
    "Answer the question. Think inside <think></think> first. Whenever you lack a fact, call the "
    "search tool (a Wikipedia search engine); you may search as many times as you need. When you "
    "know the answer, give it inside <answer></answer>, a few words only, e.g. "
    "<answer>Beijing</answer>."
)
#: ``answer``: the gold answers (any one counts); ``source``: the dataset (``nq``, ``hotpotqa``…).
QA_SCHEMA = TaskSchema(
    "QA task",
    required={"prompt": (str,), "answer": (list,)},
    optional={"source": (str,)},
    list_of={"answer": str},
)
#: A longer answer is no answer: EM would never match, but F1 could be farmed by rambling.
MAX_ANSWER_CHARS = 300


def search_r1_reward(task: Task, messages: Sequence[Message]) -> Reward:
    """1.0 when the final answer exactly matches a gold answer (SQuAD normalization), else 0.0;
    nothing for searching or for format, so no degenerate policy scores."""
    answer = extract_final_answer(last_assistant_text(messages))
    if answer is not None and (not answer or len(answer) > MAX_ANSWER_CHARS):
        answer = None
    golds = [str(g) for g in task.data["answer"]]
    em = exact_match(answer, golds)
    searches = sum(
        1 for m in messages if m.role == "assistant" for c in m.tool_calls if c.name == "search"
    )
    return Reward(
        float(em),
        {
            "em": float(em),
            "f1": f1_score(answer, golds),
            "has_answer": float(answer is not None),
            "search_calls": float(searches),
            "used_search": float(searches > 0),
            "used_tool": float(any(m.tool_calls for m in messages if m.role == "assistant")),
        },
    )


class SearchR1Env(ToolEnv):
    """QA tasks from task files (``files``: split name → task file) with ``search(query, topk)``
    over ``retriever``: a retrieval server URL (default ``$AGENTLOOP_SEARCH_URL``) or a
    :class:`Retriever`. ``max_chars`` bounds the passages' text per call;
    ``tool_max_concurrency`` and ``tool_rate_limit_per_s`` limit ``search`` calls across every
    episode of the process."""

    def __init__(
        self,
        *,
        files: Mapping[str, str] | None = None,
        retriever: Retriever | str | None = None,
        max_chars: int = 1500,
        max_turns: int | None = None,
        system_prompt: str = SYSTEM_PROMPT,
        tool_max_concurrency: int | None = None,
        tool_rate_limit_per_s: float | None = None,
    ) -> None:
        retriever = retriever or os.environ.get(SEARCH_URL_ENV)
        if not retriever:
            raise EnvError(
                "agentloop/SearchR1-v0 needs a retrieval server: set retriever=URL "
                f"(data.env_kwargs.retriever) or ${SEARCH_URL_ENV}, e.g. http://127.0.0.1:8000 "
                "after `agentloop serve-search --corpus wiki-18.jsonl --index idx/`"
            )
        tools = [
            search_tool(
                retriever,
                max_chars=max_chars,
                max_concurrency=tool_max_concurrency,
                rate_limit_per_s=tool_rate_limit_per_s,
            )
        ]
        super().__init__(tools, search_r1_reward, system_prompt=system_prompt, max_turns=max_turns)
        self.files = TaskFiles(files, QA_SCHEMA, "agentloop/SearchR1-v0")

    def tasks(self, split: str = "train", limit: int | None = None) -> list[Task]:
        return self.files.tasks(split, limit)
