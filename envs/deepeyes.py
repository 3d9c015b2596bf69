"""agentloop/DeepEyes-v0: visual questions on real images with image_zoom_in, DeepEyes' reward.

Tasks come from task files (``recipes/deepeyes/prepare_data.py`` converts DeepEyes-Datasets-47k:
one image file per task). The reward is DeepEyes' ``0.8·accuracy − 0.2·format_error +
1.2·tool_bonus`` where the tool bonus is paid **only when the answer is right** (a successful
zoom and a correct answer): paying for tool calls alone would teach the policy to zoom and never
answer. Accuracy is rule-based by default (normalized exact match, numbers, multiple-choice
letters); ``judge_url`` asks an LLM judge served by a second vLLM engine instead.

Numeric answers: when the gold answer is a number and the rules say no, math-verify decides
(``3.50`` or ``\\frac{7}{2}`` for ``3.5``, ``50\\%`` for ``50``) in a worker process with a
``grader_timeout_s`` deadline (:mod:`agentloop.envs.math_grader`). ``answer_extraction``:
``"boxed"`` (default) grades the ``<answer>``/``\\boxed{}`` content as DeepEyes does;
``"verifier"`` lets math-verify read a number from the final reply when neither is there (such
a reply still counts as a format error).
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentloop.envs.math_grader import (
    DEFAULT_GRADER_TIMEOUT_S,
    Extraction,
    check_extraction,
    grade_math,
    verdict_metrics,
)
from agentloop.envs.rewards import (
    Reward,
    extract_final_answer,
    last_assistant_text,
    math_equal,
    normalize_answer,
    to_number,
)
from agentloop.envs.task_files import TaskFiles, TaskSchema, prompt_text
from agentloop.envs.zoom_env import ZoomToolEnv
from agentloop.errors import EnvError, RewardError
from agentloop.tools.zoom import MAX_ZOOM_PIXELS, MIN_ZOOM_SIDE, zoom_tool
from agentloop.types import Message, Task, Verdict

__all__ = [
    "DEEPEYES_SCHEMA",
    "SYSTEM_PROMPT",
    "DeepEyesEnv",
    "HttpJudge",
    "Judge",
    "deepeyes_format",
    "deepeyes_reward",
    "deepeyes_score",
    "rule_match",
]

SYSTEM_PROMPT = (
    "You answer questions about an image. Think inside <think></think>. When a detail is too "
    "small to see, call image_zoom_in with its pixel box [x1, y1, x2, y2] to look closer (a few "
    "times at most). Give the final answer inside <answer></answer>."
)
DEEPEYES_SCHEMA = TaskSchema(
    "image question",
    required={"prompt": (str,), "answer": (str,), "image": (str,)},
    optional={"source": (str,)},
    paths=("image",),
)
#: DeepEyes' weights: accuracy, format error (a penalty), tool bonus (only with a right answer).
W_ACC, W_FORMAT, W_TOOL = 0.8, 0.2, 1.2
#: A longer "answer" is treated as a format error: it would let a judge be gamed by rambling.
MAX_ANSWER_CHARS = 1000
# A choice letter alone, or followed by ".", ")" or ":" ("B", "(B)", "B. green"); not "A crate …".
_CHOICE = re.compile(r"^\(?([A-J])(?:\)|\.|:|\s*$)")


def deepeyes_format(messages: Sequence[Message]) -> tuple[str | None, bool]:
    """``(answer, format_ok)``: every reply's ``<think>`` tags balance, the final reply holds one
    non-empty answer (``<answer>`` or ``\\boxed{}``) shorter than ``MAX_ANSWER_CHARS``."""
    replies = [m for m in messages if m.role == "assistant"]
    ok = all(m.content.count("<think>") == m.content.count("</think>") for m in replies)
    final = replies[-1] if replies else None
    if final is None or final.tool_calls:
        return None, False  # the episode ended without an answer (tool calls to the last turn)
    text = final.content.split("</think>")[-1]
    ok = ok and text.count("<answer>") == text.count("</answer>") <= 1
    answer = extract_final_answer(text)
    if not answer or len(answer) >= MAX_ANSWER_CHARS:
        return None, False
    return answer, ok


def rule_match(answer: str, gold: str) -> bool:
    """Rule-based accuracy: the same multiple-choice letter, the same number, or the same text
    after SQuAD normalization. Never containment: echoing the question must not score."""
    gold_choice, choice = _CHOICE.match(gold.strip()), _CHOICE.match(answer.strip())
    if gold_choice and len(gold.strip()) <= 3:
        return bool(choice) and choice.group(1) == gold_choice.group(1)  # type: ignore[union-attr]
    if math_equal(answer, gold):
        return True
    return bool(normalize_answer(gold)) and normalize_answer(answer) == normalize_answer(gold)


def deepeyes_score(*, correct: bool, format_ok: bool, zoomed: bool) -> float:
    """DeepEyes' reward: ``0.8·acc − 0.2·[format error] + 1.2·[zoomed and correct]``."""
    return W_ACC * correct - W_FORMAT * (not format_ok) + W_TOOL * (zoomed and correct)


@runtime_checkable
class Judge(Protocol):
    """Decides whether ``answer`` means the same as ``gold`` for ``question``."""

    async def __call__(self, question: str, gold: str, answer: str) -> bool: ...


_JUDGE_PROMPT = (
    "Decide whether a model's answer to a question about an image agrees with the reference "
    "answer. Wording may differ ('pink' agrees with 'it is pink'); a different fact, a hedge "
    "between options or a non-answer does not agree.\n\nQuestion: {question}\nReference answer: "
    "{gold}\nModel answer: {answer}\n\nReply with the single digit 1 if they agree, else 0."
)


@dataclass(frozen=True)
class HttpJudge:
    """An LLM judge behind an OpenAI-compatible ``/v1/chat/completions`` endpoint — a second vLLM
    engine, e.g. ``vllm serve Qwen/Qwen2.5-72B-Instruct --served-model-name judge --port 18901``
    and ``base_url="http://HOST:18901/v1"``. Greedy; retried ``retries`` times on connection
    errors and 5xx; a reply that is neither 1 nor 0 counts as 0."""

    base_url: str
    model: str = "judge"
    timeout_s: float = 60.0
    retries: int = 3

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise EnvError(f"judge_url {self.base_url!r} must be an http(s) URL ending in /v1")

    async def __call__(self, question: str, gold: str, answer: str) -> bool:
        import aiohttp

        prompt = _JUDGE_PROMPT.format(question=question, gold=gold, answer=answer)
        body = {
            "model": self.model,
            "temperature": 0.0,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": prompt}],
        }
        url = self.base_url.rstrip("/") + "/chat/completions"
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        last = ""
        for attempt in range(self.retries + 1):
            try:
                async with (
                    aiohttp.ClientSession(timeout=timeout) as session,
                    session.post(url, json=body) as resp,
                ):
                    if resp.status < 500:
                        data = await resp.json(content_type=None)
                        if resp.status >= 400:
                            raise RewardError(f"judge at {url} answered {resp.status}: {data}")
                        reply = str(data["choices"][0]["message"]["content"]).strip()
                        return reply.removeprefix("Judgement:").strip()[:1] == "1"
                    last = f"HTTP {resp.status}"
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.5 * 2**attempt)
        raise RewardError(f"judge at {url} failed {self.retries + 1} times ({last}); is it up?")


async def deepeyes_reward(
    task: Task,
    messages: Sequence[Message],
    judge: Judge | None = None,
    *,
    extraction: Extraction = "boxed",
    timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
) -> Reward:
    """DeepEyes' reward of an episode (see :func:`deepeyes_score`), with its parts as metrics.
    ``zoomed``: at least one ``image_zoom_in`` call returned an image."""
    answer, format_ok = deepeyes_format(messages)
    gold = str(task.data["answer"])
    if judge is not None:
        correct = answer is not None and await judge(prompt_text(task), gold, answer)
        verdict = Verdict(answer, gold, correct, "judge", "the LLM judge's decision")
    else:
        verdict = await _rule_verdict(answer, gold, messages, extraction, timeout_s)
    correct = verdict.correct
    zooms = sum(1 for m in messages if m.role == "tool" and m.images)
    value = deepeyes_score(correct=correct, format_ok=format_ok, zoomed=zooms > 0)
    metrics = {
        "correct": float(correct),
        "format_ok": float(format_ok),
        "zoom_calls": float(zooms),
        "tool_bonus": float(correct and zooms > 0),
        **verdict_metrics(verdict),
    }
    return Reward(value, metrics, verdict)


async def _rule_verdict(
    answer: str | None,
    gold: str,
    messages: Sequence[Message],
    extraction: Extraction,
    timeout_s: float,
) -> Verdict:
    """The rules, then (a numeric gold answer) the math grader."""
    if answer is not None and rule_match(answer, gold):
        return Verdict(answer, gold, True, "rule", "the same choice, number or text")
    if to_number(gold) is None:
        if answer is None:
            return Verdict(None, gold, False, "no answer", "no <answer> in the final reply")
        return Verdict(answer, gold, False, "rule", "not the same choice, number or text")
    reply = last_assistant_text(messages).split("</think>")[-1]
    return await grade_math(
        answer,
        gold,
        reply=reply,
        extraction=extraction,
        timeout_s=timeout_s,
        max_answer_chars=MAX_ANSWER_CHARS,
    )


@functools.lru_cache(maxsize=64)
def _load_image(path: str) -> Any:
    from PIL import Image

    with Image.open(path) as im:
        return im.convert("RGB")


class DeepEyesEnv(ZoomToolEnv):
    """Image questions from task files (``files``: split name → task file; each row names its
    image file) with ``image_zoom_in`` on the task's image. ``judge_url`` (optional) scores
    accuracy with an LLM judge (:class:`HttpJudge`, model ``judge_model``).
    ``answer_extraction`` and ``grader_timeout_s``: numeric answers, see the module docstring."""

    def __init__(
        self,
        *,
        files: Mapping[str, str] | None = None,
        judge_url: str | None = None,
        judge_model: str = "judge",
        max_turns: int | None = None,
        min_side: int = MIN_ZOOM_SIDE,
        max_pixels: int = MAX_ZOOM_PIXELS,
        system_prompt: str = SYSTEM_PROMPT,
        answer_extraction: str = "boxed",
        grader_timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
    ) -> None:
        extraction = check_extraction(answer_extraction, "agentloop/DeepEyes-v0")
        if grader_timeout_s <= 0:
            raise EnvError(f"DeepEyes-v0 grader_timeout_s must be > 0, got {grader_timeout_s}")
        judge = HttpJudge(judge_url, judge_model) if judge_url else None
        tools = [zoom_tool(min_side=min_side, max_pixels=max_pixels)]
        reward = functools.partial(
            deepeyes_reward, judge=judge, extraction=extraction, timeout_s=grader_timeout_s
        )
        super().__init__(tools, reward, system_prompt=system_prompt, max_turns=max_turns)
        self.files = TaskFiles(files, DEEPEYES_SCHEMA, "agentloop/DeepEyes-v0")

    def prompt(self, task: Task) -> list[Message]:
        try:
            image = _load_image(str(task.data["image"]))
        except OSError as exc:
            raise EnvError(
                f"task {task.id!r}: cannot open image {task.data['image']!r} ({exc}); check the "
                "task file's image paths (relative ones are relative to the file's folder)"
            ) from None
        system = [Message("system", self.system_prompt)] if self.system_prompt else []
        return [*system, Message("user", prompt_text(task), images=(image,))]

    def tasks(self, split: str = "train", limit: int | None = None) -> list[Task]:
        return self.files.tasks(split, limit)
