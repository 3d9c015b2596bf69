"""Search-R1 demo data: QA task files over a generated corpus, and a scripted expert's SFT traces.

The corpus is generated: people, companies and cities named by random codes ("Person 5521 was
born in city 7310.", "Company 4821 was founded by person 5521."), so no answer can be known without
reading its passage, and a query copies digits from the question. Its facts become
agentloop/SearchR1-v0 task files: one-hop questions ("In which city was person 5521 born?") and
two-hop ones ("In which city was the founder of company 4821 born?": the company's passage names
the founder, the founder's passage the city). The expert plays the real env against a real
retrieval server: it searches each name it needs, reads the passage and answers
``<answer>7310</answer>``; a share of its episodes answer without searching (a guess) or mistype
the answer, so a model cloned from the traces is imperfect where RL can improve it.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.envs.calc_traces import trace_row, write_traces
from agentloop.envs.registry import make
from agentloop.envs.search_qa import write_corpus
from agentloop.errors import EnvError
from agentloop.tools.search import Passage, Retriever
from agentloop.types import Message, Task, ToolCall

__all__ = [
    "SEARCH_R1_ENV_ID",
    "SearchTraceConfig",
    "SearchWorld",
    "make_search_traces",
    "search_world",
    "write_search_world",
]

SEARCH_R1_ENV_ID = "agentloop/SearchR1-v0"
_CITIES = 500  # birth cities, each a random code: no answer is more likely than another


@dataclass(frozen=True)
class SearchWorld:
    """The corpus (JSONL rows ``{id, title, text}``) and the QA tasks of each split."""

    corpus: tuple[dict[str, str], ...]
    splits: dict[str, tuple[dict[str, Any], ...]]


def _codes(count: int, rng: random.Random) -> list[str]:
    """``count`` distinct random codes of the fewest digits (>= 4) that hold them."""
    digits = 4
    while 9 * 10 ** (digits - 1) < count:
        digits += 1
    return [str(c) for c in rng.sample(range(10 ** (digits - 1), 10**digits), count)]


def _passages(
    num_docs: int, rng: random.Random
) -> tuple[list[dict[str, str]], dict[str, str], dict[str, str]]:
    """``num_docs`` passages (2/3 people, 1/3 companies founded by distinct people), each
    person's birth city and each founder's company."""
    people_n = num_docs * 2 // 3
    codes = _codes(people_n + (num_docs - people_n) + _CITIES, rng)
    people = [f"person {c}" for c in codes[:people_n]]
    companies = [f"company {c}" for c in codes[people_n:num_docs]]
    cities = codes[num_docs:]
    born = {p: rng.choice(cities) for p in people}
    founders = rng.sample(people, len(companies))
    corpus = [(p, f"Person {p.split()[1]} was born in city {born[p]}.") for p in people]
    founded = dict(zip(founders, companies, strict=True))
    corpus += [(c, f"Company {c.split()[1]} was founded by {f}.") for f, c in founded.items()]
    rng.shuffle(corpus)
    rows = [
        {"id": f"sr1doc-{i:05d}", "title": title, "text": text}
        for i, (title, text) in enumerate(corpus)
    ]
    return rows, born, founded


def search_world(
    num_docs: int = 2000, seed: int = 1, two_hop_rate: float = 0.0, num_test: int = 200
) -> SearchWorld:
    """Task rows ``{id, prompt, answer: [city code], source: 1hop|2hop, hops: [names searched]}``
    over ``num_docs`` generated passages ("Person 5521 was born in city 7310.", "Company 4821 was
    founded by person 5521."): a question per person (its birth city) or, for a
    ``two_hop_rate`` share of the people who founded a company, per company (its founder's birth
    city). Entities are named by random codes, which a small model copies as easily as digits.
    ``num_test`` of them, people and companies of their own, are the ``test`` split."""
    if not 0.0 <= two_hop_rate <= 1.0 or num_test < 1 or num_docs < 3:
        raise EnvError(
            f"two_hop_rate={two_hop_rate} must be in [0, 1], num_test={num_test} >= 1 and "
            f"num_docs={num_docs} >= 3"
        )
    rng = random.Random(f"search-r1-demo/{seed}")
    corpus, born, founded = _passages(num_docs, rng)
    rows = []
    for person, city in born.items():
        company = founded.get(person)
        if company and rng.random() < two_hop_rate:
            prompt, source = f"In which city was the founder of {company} born?", "2hop"
            hops = [company, person]
        else:
            prompt, source, hops = f"In which city was {person} born?", "1hop", [person]
        rows.append({"prompt": prompt, "answer": [city], "source": source, "hops": hops})
    if len(rows) <= num_test:
        raise EnvError(
            f"num_docs={num_docs} gives {len(rows)} questions; need > num_test={num_test}"
        )
    rng.shuffle(rows)
    splits = {"test": rows[:num_test], "train": rows[num_test:]}
    return SearchWorld(
        tuple(corpus),
        {
            name: tuple({"id": f"sr1demo-{name}-{i:05d}", **r} for i, r in enumerate(split))
            for name, split in splits.items()
        },
    )


def write_search_world(world: SearchWorld, out: Path) -> dict[str, Path]:
    """Write ``corpus.jsonl``, ``train.jsonl`` and ``test.jsonl`` under ``out``; their paths."""
    passages = [Passage(d["id"], d["title"], d["text"]) for d in world.corpus]
    paths = {"corpus": write_corpus(out / "corpus.jsonl", passages)}
    for name, rows in world.splits.items():
        paths[name] = write_traces(rows, out / f"{name}.jsonl")
    return paths


@dataclass(frozen=True)
class SearchTraceConfig:
    """What :func:`make_search_traces` writes: ``num_traces`` single episodes exactly as a
    rollout sees them (tool schemas in the prompt), plus ``num_compact`` rows that chain
    ``questions_per_compact`` episodes into one conversation without the schemas (the skill
    forms in fewer, shorter CPU steps; ``envs/calc_traces.py`` says why), over the first
    train tasks of ``files`` (cycled), searched on ``retriever`` (a server URL, or a
    :class:`~agentloop.tools.search.Retriever`), ``topk``
    passages a search, the env's ``max_chars`` of them. ``guess_rate`` of the
    episodes answer a random city without searching, ``typo_rate`` mistype the answer."""

    files: dict[str, str]
    retriever: Retriever | str
    num_traces: int = 400
    num_compact: int = 0
    questions_per_compact: int = 4
    guess_rate: float = 0.0
    typo_rate: float = 0.0
    topk: int = 1
    max_chars: int = 300
    seed: int = 0
    concurrency: int = 8

    def __post_init__(self) -> None:
        rates = (self.guess_rate, self.typo_rate, 1.0 - self.guess_rate - self.typo_rate)
        if min(rates) < 0.0 or self.num_traces + self.num_compact < 1:
            raise EnvError(
                f"SearchTraceConfig: guess_rate={self.guess_rate} and typo_rate="
                f"{self.typo_rate} must be >= 0 with a sum <= 1, and num_traces + num_compact "
                f"= {self.num_traces + self.num_compact} >= 1"
            )

    @property
    def num_episodes(self) -> int:
        return self.num_traces + self.num_compact * self.questions_per_compact


_Episode = tuple[list[Message], list[dict[str, Any]], float]


def _mistype(word: str, rng: random.Random) -> str:
    pos = rng.randrange(1, len(word)) if len(word) > 1 else 0
    alphabet = "0123456789" if word.isdigit() else "aeioukrstn"
    letter = rng.choice([c for c in alphabet if c != word[pos].lower()])
    return word[:pos] + letter + word[pos + 1 :]


def _read(observation: Sequence[Message], name: str, pattern: str) -> str:
    """The fact ``pattern`` (a regex with one group) of ``name``'s passage in a tool output."""
    text = observation[0].content if observation else ""
    for line in text.splitlines():
        if m := re.search(rf"\({re.escape(name)}\): .*?{pattern}", line, re.IGNORECASE):
            return m[1]
    raise EnvError(
        f"the search for {name!r} did not return its passage ({text[:200]!r}); the retrieval "
        "server must serve the demo's corpus"
    )


async def _episode(
    task: Task, cfg: SearchTraceConfig, kind: str, guess: str, rng: random.Random
) -> _Episode:
    """The expert on ``task``: ``kind`` is ``"expert"``, ``"typo"`` or ``"guess"`` (answer
    ``guess``, another question's answer, without searching)."""
    env: Any = make(
        SEARCH_R1_ENV_ID, files=cfg.files, retriever=cfg.retriever, max_chars=cfg.max_chars
    )
    try:
        messages, _ = await env.reset(options={"task": task})
        answer = guess
        names = list(task.data["hops"]) if kind != "guess" else []
        for i, name in enumerate(names):
            call = ToolCall(
                name="search", arguments={"query": name, "topk": cfg.topk}, id=f"call_{i}"
            )
            messages.append(Message("assistant", "", (call,)))
            step = await env.step(messages[-1])
            messages += step.observation
            if i + 1 < len(names):
                names[i + 1] = _read(step.observation, name, r"founded by (person \d+)\.")
            else:
                answer = _read(step.observation, name, r"was born in city (\d+)")
        if kind == "typo":
            answer = _mistype(answer, rng)
        messages.append(Message("assistant", f"<answer>{answer}</answer>"))
        final = await env.step(messages[-1])
    finally:
        await env.close()
    return messages, env.tool_schemas, float(final.reward)


async def make_search_traces(config: SearchTraceConfig) -> list[dict[str, Any]]:
    """Play the scripted expert on the train tasks of ``config.files`` through the real
    SearchR1-v0 env and its search server: JSON-ready rows as ``make_calc_traces`` writes them
    (``messages``, ``tools`` on rollout-format rows, ``task_ids``, ``answers``, ``reward``),
    rollout-format and compact rows shuffled together, seeded. Deterministic."""
    env: Any = make(SEARCH_R1_ENV_ID, files=config.files, retriever=config.retriever)
    tasks = env.tasks("train")
    await env.close()
    n = config.num_episodes
    tasks = [tasks[i % len(tasks)] for i in range(n)]
    rng = random.Random(f"search-traces/{config.seed}")
    order = rng.sample(range(n), n)
    guesses = set(order[: round(config.guess_rate * n)])
    typos = set(order[len(guesses) : len(guesses) + round(config.typo_rate * n)])
    answers = sorted({str(t.data["answer"][0]) for t in tasks})
    slots = asyncio.Semaphore(config.concurrency)

    async def one(i: int) -> _Episode:
        kind = "guess" if i in guesses else "typo" if i in typos else "expert"
        own = random.Random(f"search-traces/{config.seed}/{i}")
        guess = own.choice([a for a in answers if a != tasks[i].data["answer"][0]])
        async with slots:
            return await _episode(tasks[i], config, kind, guess, own)

    episodes = list(await asyncio.gather(*(one(i) for i in range(n))))
    k, full = config.questions_per_compact, config.num_traces
    rows = [trace_row(episodes[i : i + 1], tasks[i : i + 1], with_tools=True) for i in range(full)]
    rows += [
        trace_row(episodes[i : i + k], tasks[i : i + k], with_tools=False)
        for i in range(full, n, k)
    ]
    rng.shuffle(rows)
    return rows
