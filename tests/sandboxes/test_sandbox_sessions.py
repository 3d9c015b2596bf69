"""Acceptance: session state persists across runs in a session and never leaks between sessions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FIRST = """
import json, math
counter = 1
def bump():
    global counter
    counter += 1
    return counter
with open("state.json", "w") as f:
    json.dump({"who": WHO}, f)
"""


async def test_state_persists_within_a_session_and_never_leaks(sandbox: Any) -> None:
    async with sandbox.session() as a, sandbox.session() as b:
        assert a.id != b.id
        await asyncio.gather(a.run(FIRST.replace("WHO", "'a'")), b.run(FIRST.replace("WHO", "'b'")))
        for _ in range(2):
            await a.run("bump()")
        res_a = await a.run("print(counter, math.sqrt(16), json.load(open('state.json'))['who'])")
        res_b = await b.run("print(counter, json.load(open('state.json'))['who'])")
        assert res_a.stdout == "3 4.0 a\n", res_a
        assert res_b.stdout == "1 b\n", res_b
    async with sandbox.session() as c:  # a new session starts clean
        fresh = await c.run(
            "import os\nprint('counter' in globals(), os.path.exists('state.json'))"
        )
        assert fresh.stdout == "False False\n", fresh
    one_off = await sandbox.run("print('counter' in globals())")
    assert one_off.stdout == "False\n"
