"""agentloop/SearchQA-v0: multi-hop questions over a synthetic encyclopedia, a search tool, EM/F1.

The corpus is generated (no network): made-up countries, cities, people and companies, one
passage each, whose facts chain into 2- and 3-hop questions ("In which country was the founder
of Velkor Systems born?"). Each task lists its hops — a sub-query and the passage that answers
it — which is what retrieval recall is measured on.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.envs.rewards import Reward, exact_match, extract_boxed, f1_score, last_assistant_text
from agentloop.envs.tool_env import ToolEnv
from agentloop.errors import EnvError
from agentloop.tools.search import Passage, Retriever, search_tool
from agentloop.types import Message, Task

__all__ = [
    "SEARCH_URL_ENV",
    "SYSTEM_PROMPT",
    "SearchQAEnv",
    "searchqa_corpus",
    "searchqa_reward",
    "searchqa_tasks",
    "synthetic_corpus",
    "write_corpus",
]

SEARCH_URL_ENV = "AGENTLOOP_SEARCH_URL"
SYSTEM_PROMPT = (
    "Answer the question using the search tool: the answer is in the knowledge base, and most "
    "questions need two or three searches, one fact at a time. Give the final answer as "
    "\\boxed{answer}."
)
_SPLITS = ("train", "test")
_ONSETS = (
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gr",
    "kr",
    "tr",
    "st",
    "th",
    "sh",
)
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou")
_CODAS = ("", "", "n", "r", "s", "l", "th", "nd", "rk", "x")
_JOBS = (
    "chemist",
    "architect",
    "composer",
    "engineer",
    "painter",
    "surgeon",
    "botanist",
    "historian",
    "pilot",
    "economist",
)
_INDUSTRIES = (
    "shipping",
    "software",
    "textile",
    "mining",
    "aerospace",
    "publishing",
    "brewing",
    "robotics",
    "insurance",
    "glassware",
)
_SUFFIXES = ("Systems", "Industries", "Works", "Holdings", "Labs", "Group", "Trading", "Motors")


@dataclass(frozen=True)
class _World:
    passages: tuple[Passage, ...]
    questions: tuple[dict[str, Any], ...]


class _Names:
    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set[str]()

    def word(self, syllables: int) -> str:
        while True:
            w = "".join(
                self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)
            ) + self.rng.choice(_CODAS)
            if w not in self.used:
                self.used.add(w)
                return w.capitalize()


def _world(seed: int, countries: int, cities: int, people: int, companies: int) -> _World:
    rng = random.Random(f"searchqa/{seed}")
    names = _Names(rng)
    ps: list[Passage] = []
    qs: list[dict[str, Any]] = []
    country = [(names.word(2), names.word(2).lower()) for _ in range(countries)]
    city = [(names.word(rng.choice((2, 3))), rng.randrange(countries)) for _ in range(cities)]
    capital = {
        c: next((i for i, (_, cc) in enumerate(city) if cc == c), None) for c in range(countries)
    }
    for i, (name, currency) in enumerate(country):
        cap = capital[i]
        cap_text = f" Its capital is {city[cap][0]}." if cap is not None else ""
        text = f"{name} is a country whose currency is the {currency}.{cap_text}"
        ps.append(Passage(f"country-{i:04d}", name, text))
    for i, (name, c) in enumerate(city):
        text = (
            f"{name} is a city in {country[c][0]} with about {rng.randrange(20, 900)},000 "
            f"inhabitants, on the {names.word(2)} river."
        )
        ps.append(Passage(f"city-{i:04d}", name, text))
        qs.append(
            {
                "q": f"What is the currency of the country in which {name} lies?",
                "a": country[c][1],
                "hops": [(name, f"city-{i:04d}"), (country[c][0], f"country-{c:04d}")],
            }
        )
    person = [(f"{names.word(2)} {names.word(2)}", rng.randrange(cities)) for _ in range(people)]
    for i, (name, c) in enumerate(person):
        text = (
            f"{name} is a {rng.choice(_JOBS)} born in {city[c][0]} in {rng.randrange(1900, 2000)}."
        )
        ps.append(Passage(f"person-{i:04d}", name, text))
    _add_companies(rng, names, companies, person, city, country, ps, qs)
    return _World(tuple(ps), tuple(qs))


def _add_companies(
    rng: random.Random,
    names: _Names,
    companies: int,
    person: list[tuple[str, int]],
    city: list[tuple[str, int]],
    country: list[tuple[str, str]],
    ps: list[Passage],
    qs: list[dict[str, Any]],
) -> None:
    """Company passages, each with three questions of 2-3 hops through founder, city, country."""
    people, cities = len(person), len(city)
    for i in range(companies):
        name = f"{names.word(2)} {rng.choice(_SUFFIXES)}"
        f, hq = rng.randrange(people), rng.randrange(cities)
        founder, born = person[f][0], person[f][1]
        text = (
            f"{name} is a {rng.choice(_INDUSTRIES)} company founded in "
            f"{rng.randrange(1950, 2020)} by {founder}. Its headquarters are in {city[hq][0]}."
        )
        ps.append(Passage(f"company-{i:04d}", name, text))
        hop_company, hop_founder = (name, f"company-{i:04d}"), (founder, f"person-{f:04d}")
        hop_city = (city[born][0], f"city-{born:04d}")
        qs.append(
            {
                "q": f"In which city was the founder of {name} born?",
                "a": city[born][0],
                "hops": [hop_company, hop_founder],
            }
        )
        qs.append(
            {
                "q": f"In which country was the founder of {name} born?",
                "a": country[city[born][1]][0],
                "hops": [hop_company, hop_founder, hop_city],
            }
        )
        qs.append(
            {
                "q": f"In which country are the headquarters of {name}?",
                "a": country[city[hq][1]][0],
                "hops": [hop_company, (city[hq][0], f"city-{hq:04d}")],
            }
        )


@functools.cache
def _shipped() -> _World:
    return _world(0, countries=12, cities=48, people=160, companies=120)


def searchqa_corpus() -> list[Passage]:
    """The SearchQA-v0 corpus (340 passages, the same on every machine)."""
    return list(_shipped().passages)


def synthetic_corpus(num_docs: int, seed: int = 1) -> list[Passage]:
    """A larger corpus of the same kind with about ``num_docs`` passages (benchmarks)."""
    n = max(num_docs, 20)
    world = _world(
        seed,
        countries=max(n // 100, 4),
        cities=n // 10,
        people=n // 2,
        companies=n - n // 100 - n // 10 - n // 2,
    )
    return list(world.passages[:num_docs])


def searchqa_tasks(split: str) -> list[Task]:
    """All tasks of ``split`` (80% of the questions train, 20% test; fixed)."""
    if split not in _SPLITS:
        raise EnvError(f"SearchQA-v0 split {split!r} is unknown; use one of {_SPLITS}")
    questions = list(_shipped().questions)
    random.Random("searchqa/split").shuffle(questions)
    cut = len(questions) * 4 // 5
    chosen = questions[:cut] if split == "train" else questions[cut:]
    return [
        Task(
            id=f"searchqa-{split}-{i:05d}",
            data={
                "prompt": q["q"],
                "answer": q["a"],
                "hops": [{"query": query, "doc_id": doc} for query, doc in q["hops"]],
            },
        )
        for i, q in enumerate(chosen)
    ]


def write_corpus(path: str | os.PathLike[str], passages: Sequence[Passage] | None = None) -> Path:
    """Write ``passages`` (default: the SearchQA corpus) as JSONL ``{"id", "title", "text"}``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for p in passages if passages is not None else searchqa_corpus():
            f.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n")
    return out


def searchqa_reward(task: Task, messages: Sequence[Message]) -> Reward:
    """Exact match of the last ``\\boxed{}`` with the answer (SQuAD normalization), F1 as a
    metric, with format and tool-use metrics."""
    answer = extract_boxed(last_assistant_text(messages))
    em = exact_match(answer, task.data["answer"])
    calls = [c for m in messages if m.role == "assistant" for c in m.tool_calls]
    searches = sum(1 for c in calls if c.name == "search")
    return Reward(
        float(em),
        {
            "em": float(em),
            "f1": f1_score(answer, task.data["answer"]),
            "has_boxed": float(answer is not None),
            "search_calls": float(searches),
            "used_search": float(searches > 0),
        },
    )


@functools.cache
def _local_retriever() -> Retriever:
    """An in-process BM25 index over the shipped corpus, built once per machine (cached)."""
    from agentloop.tools.search_index import IndexRetriever, build_index, load_index

    target = Path("~/.cache/agentloop/searchqa-v0-bm25").expanduser()
    if not (target / "meta.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".searchqa-", dir=target.parent))
        try:
            build_index(searchqa_corpus(), tmp, kind="bm25", progress=False)
            os.rename(tmp, target)  # atomic: a concurrent builder's copy wins or loses whole
        except OSError:
            if not (target / "meta.json").is_file():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return IndexRetriever(load_index(target, kind="bm25"))


class SearchQAEnv(ToolEnv):
    """Multi-hop questions; ``search`` queries ``retriever``: a :class:`Retriever`, the URL of a
    retrieval server (``agentloop serve-search``), or by default ``$AGENTLOOP_SEARCH_URL`` if
    set, else an in-process BM25 index over the shipped corpus. ``tool_max_concurrency`` and
    ``tool_rate_limit_per_s`` limit ``search`` calls across every episode of the process."""

    def __init__(
        self,
        *,
        retriever: Retriever | str | None = None,
        max_turns: int | None = None,
        max_chars: int = 1200,
        tool_max_concurrency: int | None = None,
        tool_rate_limit_per_s: float | None = None,
    ) -> None:
        if retriever is None:
            retriever = os.environ.get(SEARCH_URL_ENV) or _local_retriever()
        tools = [
            search_tool(
                retriever,
                max_chars=max_chars,
                max_concurrency=tool_max_concurrency,
                rate_limit_per_s=tool_rate_limit_per_s,
            )
        ]
        super().__init__(tools, searchqa_reward, system_prompt=SYSTEM_PROMPT, max_turns=max_turns)

    def tasks(self, split: str = "train", limit: int | None = None) -> list[Task]:
        tasks = searchqa_tasks(split)
        return tasks if limit is None else tasks[:limit]

    def sample_task(self, seed: int | None) -> Task:
        tasks = searchqa_tasks("train")
        return tasks[(seed or 0) % len(tasks)]
