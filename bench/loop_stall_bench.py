"""Benchmark: how long one huge tool output blocks the event loop (every other episode waits).

One episode calls a tool that returns ``--mb`` megabytes of text (the real tiny tokenizer and
chat template, a fake engine); a ticker task measures the longest gap between its 10 ms wakeups.
"before" times the old cut, which tokenized the whole output on the loop before truncating
(``truncate_to_tokens`` without ``max_token_chars``, called as the rollout used to); "after" is
the loop's longest stall in a real ``collect`` today (a character pre-cut derived from the token
cap, the rest on a worker thread).

    .venv/bin/python bench/loop_stall_bench.py [--mb 10] [--cap 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from collections.abc import Sequence

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.fake import FakeEngine
from agentloop.envs import ToolEnv
from agentloop.models.tiny import tiny_model_dir
from agentloop.rollout import RolloutConfig
from agentloop.tools import tool, truncate_to_tokens
from agentloop.types import Message, Task


def _text(chars: int) -> str:
    return ("word, 12345 éà\n" * (chars // 15 + 1))[:chars]


@tool
def flood(chars: int) -> str:
    """Print a lot.

    Args:
        chars: How many characters.
    """
    return _text(chars)


def _no_reward(task: Task, messages: Sequence[Message]) -> float:
    return 0.0


def _env() -> ToolEnv:
    return ToolEnv([flood], _no_reward)


async def _stall_after(builder: TokenBuilder, tokenizer: object, chars: int, cap: int) -> float:
    gaps = [0.0]
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    call = json.dumps({"name": "flood", "arguments": {"chars": chars}})
    engine = FakeEngine([f"<tool_call>\n{call}\n</tool_call>", "done"], tokenizer=tokenizer,
                        eos_token_id=2)  # fmt: skip
    config = RolloutConfig(max_tool_output_tokens=cap, max_response_len=4 * cap + 1024)
    watch = asyncio.create_task(ticker())
    await collect([Task("t", {"prompt": "q"})], _env, engine, builder, config=config)
    done.set()
    await watch
    return max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="tool output size in MB")
    parser.add_argument("--cap", type=int, default=256, help="rollout.max_tool_output_tokens")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    builder = TokenBuilder(tokenizer, tools=_env().tool_schemas)
    chars = int(args.mb * 1_000_000)
    t0 = time.perf_counter()
    truncate_to_tokens(_text(chars), args.cap, builder.encode, builder.decode)  # the old cut
    before = time.perf_counter() - t0
    after = asyncio.run(_stall_after(builder, tokenizer, chars, args.cap))
    print(json.dumps({"bench": "loop_stall", "output_chars": chars, "cap_tokens": args.cap,
                      "stall_before_s": round(before, 3), "stall_after_s": round(after, 3),
                      "python": platform.python_version()}))  # fmt: skip


if __name__ == "__main__":
    main()
