"""The trajectory viewer: page data, escaping, and a real headless Chromium clicking through it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.fake import FakeEngine
from agentloop.envs import make
from agentloop.io import JsonlWriter, trajectory_to_dict
from agentloop.rollout import RolloutConfig
from agentloop.types import Trajectory
from agentloop.viewer import build_html, view_data, write_view

ENV = "agentloop/Calc-v0"
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
XSS = '</script><script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-quic",
]  # fmt: skip


def _policy(tokenizer: Any, answers: dict[str, str]) -> Any:
    """Calls python with the answer, then boxes the tool's output; one sample mistypes the tool
    name first (an error observation); "What is …" questions get a rogue, script-laden reply."""

    def respond(prompt_ids: Any, sampling: Any) -> str:
        text = tokenizer.decode(prompt_ids)
        question = re.findall(r"user\n(.*?)<\|im_end\|>", text)[0]
        outputs = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)
        if question.startswith("What is"):
            return f"I refuse. {XSS}"
        if not outputs:
            call = {"name": "python", "arguments": {"code": f"print({answers[question]})"}}
            return f"Let me compute.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
        if len(outputs) == 1 and sampling.seed is not None and sampling.seed % 2:
            call = {"name": "calculator", "arguments": {"expr": "1+1"}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return f"The answer is \\boxed{{{outputs[0]}}}."

    return FakeEngine(respond, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)


def oracle_trajectories(tokenizer: Any, num_tasks: int = 4, n: int = 2) -> list[Trajectory]:
    env = make(ENV)
    tasks = env.tasks("test", num_tasks)
    answers = {t.data["prompt"]: t.data["answer"] for t in tasks}
    builder = TokenBuilder(tokenizer, tools=env.tool_schemas)
    config = RolloutConfig(max_turns=4, max_response_len=256)
    groups = asyncio.run(
        collect(tasks, ENV, _policy(tokenizer, answers), builder, config=config, group_size=n)
    )
    return [t for g in groups for t in g.trajectories]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, tiny_model_dir: Path) -> Path:
    from PIL import Image

    run = tmp_path_factory.mktemp("run")
    trajs = oracle_trajectories(tokenizer)
    image = Image.new("RGB", (48, 32), (37, 99, 235))
    trajs[0] = dataclasses.replace(trajs[0], images=(image, "javascript:alert(1)"))
    with JsonlWriter(run / "trajectories.jsonl") as w:
        for t in trajs:
            w.write({**trajectory_to_dict(t), "env": ENV})
    (run / "config.json").write_text(json.dumps({"model": str(tiny_model_dir)}))
    (run / "summary.json").write_text(json.dumps({"reward": {"mean": 0.5, "lo": 0.1, "hi": 0.9},
                                                  "pass_at_k": {"1": 0.5, "2": 0.75}}))  # fmt: skip
    return run


def test_the_fixture_has_tool_calls_errors_and_masked_tokens(run_dir: Path) -> None:
    records = [
        json.loads(line)
        for line in (run_dir / "trajectories.jsonl").read_text().split("\n")
        if line
    ]
    assert {r["stop_reason"] for r in records} == {"done"}
    assert {r["reward"] for r in records} == {0.0, 1.0}
    assert any(r["metrics"].get("tool_error/unknown_tool") for r in records)
    first = records[0]
    response_mask = first["loss_mask"][first["prompt_len"] :]
    assert 0 in response_mask and 1 in response_mask  # tool output is masked inside the response


def test_view_data_decodes_tokens_and_drops_unsafe_images(run_dir: Path, tokenizer: Any) -> None:
    records = [
        json.loads(line)
        for line in (run_dir / "trajectories.jsonl").read_text().split("\n")
        if line
    ]
    data = view_data(records, tokenizer=tokenizer)
    t = data["trajectories"][0]
    assert len(t["ids"]) == len(t["mask"]) == len(t["logprobs"])
    assert data["vocab"][str(tokenizer.eos_token_id)] == "<|im_end|>"
    assert len(t["images"]) == 1 and t["images"][0].startswith("data:image/png;base64,")
    assert t["messages"][2]["tool_calls"][0]["name"] == "python"
    assert view_data(records)["vocab"] == {}  # no tokenizer: the page shows ids
    verdicts = [v["verdict"] for v in data["trajectories"]]  # the reward's, for every episode
    assert {v["by"] for v in verdicts} == {"numeric", "no answer"}, verdicts
    assert all(v["correct"] == (r["reward"] == 1.0) for v, r in zip(verdicts, records, strict=True))


def test_html_is_self_contained_and_inert(run_dir: Path) -> None:
    records = [
        json.loads(line)
        for line in (run_dir / "trajectories.jsonl").read_text().split("\n")
        if line
    ]
    html = build_html(records, title="<b>run</b>")
    assert "__pwned" in html  # the payload is in the data…
    assert "</script><script>window.__pwned" not in html  # …but cannot close the data element
    assert html.count("</script>") == 2  # the data element and the code
    assert "<b>run</b>" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the page must not fetch"


def test_cli_writes_the_view(run_dir: Path) -> None:
    from agentloop.cli import main

    assert main(["view", str(run_dir), "-o", str(run_dir / "cli.html"), "--limit", "3"]) == 0
    html = (run_dir / "cli.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "calc-test-000001" in html
    assert "calc-test-000002" not in html  # --limit 3 keeps the first three (tasks 0, 0, 1)
    assert main(["view", str(run_dir / "nope")]) == 2


@pytest.fixture
def chromium() -> Iterator[Any]:
    """Debian's headless Chromium, driven through playwright (closed afterwards)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def test_viewer_in_headless_chromium(run_dir: Path, chromium: Any) -> None:
    page_path = write_view(run_dir)
    ARTIFACTS.mkdir(exist_ok=True)
    errors: list[str] = []
    requests: list[str] = []
    page = chromium.new_page(viewport={"width": 1500, "height": 1500})
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(page_path.as_uri())
    rows = page.locator("#rows tr")
    assert rows.count() == 8
    rows.nth(0).click()
    verdict = page.locator("#verdict").inner_text()  # the answer read and why it scored so
    assert "by numeric" in verdict and "gold" in verdict and "as numbers" in verdict, verdict
    strip = page.locator("#strip")
    assert strip.locator(".tok.trained").count() > 0
    assert strip.locator(".tok.masked").count() > 0  # tool output inside the response
    assert "<tool_response>" in strip.locator(".tok.masked").all_inner_texts()
    title = strip.locator(".tok.trained").first.get_attribute("title") or ""
    assert "logprob -" in title and "trained" in title
    assert page.locator(".call .name").first.inner_text() == "python"
    assert page.locator(".msg.tool pre").count() >= 1
    assert page.locator("img.obs").count() == 1
    page.locator(".tok.trained").nth(3).hover()
    assert "logprob" in page.locator("#tip").inner_text()
    page.screenshot(path=str(ARTIFACTS / "viewer.png"))
    _check_filters_and_escaping(page)
    assert not errors, errors
    assert all(u.startswith(("file://", "data:")) for u in requests), requests


def _check_filters_and_escaping(page: Any) -> None:
    page.select_option("#f-stop", "done")
    page.fill("#f-min", "1")
    assert 0 < page.locator("#rows tr").count() < 8
    page.fill("#f-min", "")
    page.fill("#f-search", "refuse")
    assert page.locator("#rows tr").count() == 2
    page.locator("#rows tr").first.click()
    assert page.evaluate("window.__pwned") is None
    assert XSS in page.locator(".msg.assistant pre").first.inner_text()
