"""Search-R1 demo data: QA task files over a generated corpus, and a scripted expert's SFT traces.

The corpus is :func:`~agentloop.envs.search_qa.synthetic_corpus` (made-up people, cities and
companies, so no answer can be known without reading its passage). Its facts become
agentloop/SearchR1-v0 task files: one-hop questions ("In which city was Brakou Denth born?") and
two-hop ones ("In which city was the founder of Velkor Systems born?": the company's passage names
the founder, the founder's passage the city). The expert plays the real env against a real
retrieval server: it searches each name it needs, reads the passage and answers
``<answer>City</answer>``; a share of its episodes answer without searching (a guess) or mistype
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

from agentloop.envs.calc_traces import write_traces
from agentloop.envs.registry import make
from agentloop.envs.search_qa import synthetic_corpus, write_corpus
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
_PERSON = re.compile(r"^(?P<name>.+?) is an? \w+ born in (?P<city>\w+) in \d{4}\.$")
_COMPANY = re.compile(r"^(?P<name>.+?) is an? \w+ company founded in \d{4} by (?P<founder>.+?)\.")


@dataclass(frozen=True)
class SearchWorld:
    """The corpus (JSONL rows ``{id, title, text}``) and the QA tasks of each split."""

    corpus: tuple[dict[str, str], ...]
    splits: dict[str, tuple[dict[str, Any], ...]]


def search_world(
    num_docs: int = 2000, seed: int = 1, two_hop_rate: float = 0.0, num_test: int = 200
) -> SearchWorld:
    """Task rows ``{id, prompt, answer: [city], source: 1hop|2hop, hops: [names searched]}`` over
    ``synthetic_corpus(num_docs, seed)``: a question per person (its birth city) or, for a
    ``two_hop_rate`` share of the people who founded a company, per company (its founder's birth
    city). ``num_test`` of them, people and companies of their own, are the ``test`` split."""
    if not 0.0 <= two_hop_rate <= 1.0 or num_test < 1:
        raise EnvError(
            f"two_hop_rate={two_hop_rate} must be in [0, 1] and num_test={num_test} >= 1"
        )
    passages = synthetic_corpus(num_docs, seed)
    born: dict[str, str] = {}
    founded: dict[str, list[str]] = {}
    for p in passages:
        if m := _PERSON.match(p.text):
            born[m["name"]] = m["city"]
        elif m := _COMPANY.match(p.text):
            founded.setdefault(m["founder"], []).append(m["name"])
    rng = random.Random(f"search-r1-demo/{seed}")
    rows = []
    for person, city in born.items():
        companies = founded.get(person, [])
        if companies and rng.random() < two_hop_rate:
            company = rng.choice(companies)
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
    corpus = tuple({"id": p.id, "title": p.title, "text": p.text} for p in passages)
    return SearchWorld(
        corpus,
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
    letter = rng.choice([c for c in "aeioukrstn" if c != word[pos].lower()])
    return word[:pos] + letter + word[pos + 1 :]


def _read(observation: Sequence[Message], name: str, pattern: str) -> str:
    """The fact ``pattern`` (a regex with one group) of ``name``'s passage in a tool output."""
    text = observation[0].content if observation else ""
    for line in text.splitlines():
        if m := re.search(rf"\({re.escape(name)}\): .*?{pattern}", line):
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
                names[i + 1] = _read(step.observation, name, r"founded in \d{4} by (.+?)\.")
            else:
                answer = _read(step.observation, name, r"is an? \w+ born in (\w+)")
        if kind == "typo":
            answer = _mistype(answer, rng)
        messages.append(Message("assistant", f"<answer>{answer}</answer>"))
        final = await env.step(messages[-1])
    finally:
        await env.close()
    return messages, env.tool_schemas, float(final.reward)


def _row(
    episodes: Sequence[_Episode], tasks: Sequence[Task], *, with_tools: bool
) -> dict[str, Any]:
    messages = list(episodes[0][0])
    for later, _, _ in episodes[1:]:  # the next question continues the conversation
        messages += [m for m in later if m.role != "system"]
    row: dict[str, Any] = {"messages": [_openai_dict(m) for m in messages]}
    if with_tools:
        row["tools"] = episodes[0][1]
    row.update(
        task_ids=[t.id for t in tasks],
        answers=[t.data["answer"] for t in tasks],
        reward=sum(e[2] for e in episodes) / len(episodes),
    )
    return row


def _openai_dict(m: Message) -> dict[str, Any]:
    out = m.to_dict()
    if m.role == "tool":
        out.setdefault("tool_call_id", m.tool_call_id or "call_0")
    return out


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
    rows = [_row(episodes[i : i + 1], tasks[i : i + 1], with_tools=True) for i in range(full)]
    rows += [
        _row(episodes[i : i + k], tasks[i : i + k], with_tools=False) for i in range(full, n, k)
    ]
    rng.shuffle(rows)
    return rows
