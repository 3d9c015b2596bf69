"""SFT: synthetic Calc traces, the data schema check, token-exact tokenization, sft_step, the
recipe (config, schedule, resume, export)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.envs import make
from agentloop.envs.calc import make_calc_task
from agentloop.envs.calc_traces import (
    TraceConfig,
    expert_expression,
    make_calc_traces,
    write_traces,
)
from agentloop.errors import ConfigError, EnvError
from agentloop.trainers.sft_data import (
    SFTTokenizer,
    assistant_text,
    holdout_split,
    load_conversations,
    parse_row,
)
from agentloop.types import Message, Task, ToolCall

ENV = "agentloop/Calc-v0"


def _traces(**kw: Any) -> list[dict[str, Any]]:
    return asyncio.run(make_calc_traces(TraceConfig(sandbox="fake", digits=2, **kw)))


# ---------------------------------------------------------------------- traces
def test_calc_traces_rows_are_deterministic_and_correct() -> None:
    rows = _traces(num_traces=6, num_compact=3, questions_per_compact=3)
    assert rows == _traces(num_traces=6, num_compact=3, questions_per_compact=3)
    full = [r for r in rows if "tools" in r]
    compact = [r for r in rows if "tools" not in r]
    assert len(full) == 6 and len(compact) == 3
    for r in full:
        roles = [m["role"] for m in r["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        call = r["messages"][2]["tool_calls"][0]["function"]
        assert call["name"] == r["tools"][0]["function"]["name"] == "python"
        assert r["messages"][3]["content"] == r["answers"][0]
        assert r["messages"][4]["content"] == f"\\boxed{{{r['answers'][0]}}}"
        assert r["reward"] == 1.0
    for r in compact:
        roles = [m["role"] for m in r["messages"]]
        assert roles == ["system"] + ["user", "assistant", "tool", "assistant"] * 3
        assert len(r["task_ids"]) == 3 and r["reward"] == 1.0
    ids = [t for r in rows for t in r["task_ids"]]
    assert sorted(ids) == [f"calc-train-{i:06d}" for i in range(15)]  # each task once


def test_calc_traces_typos_copy_one_digit_wrong() -> None:
    rows = _traces(num_traces=20, typo_rate=0.5)
    wrong = [r for r in rows if r["reward"] == 0.0]
    assert len(wrong) == 10
    for r in wrong:
        task = make_calc_task("train", int(r["task_ids"][0].rsplit("-", 1)[1]), digits=2)
        code = r["messages"][2]["tool_calls"][0]["function"]["arguments"]["code"]
        typed = code.removeprefix("print(").removesuffix(")")
        good = expert_expression(task)
        assert len(typed) == len(good)
        assert sum(a != b for a, b in zip(typed, good, strict=True)) == 1
        assert r["messages"][4]["content"] == f"\\boxed{{{r['messages'][3]['content']}}}"


def test_make_calc_traces_cli_writes_loadable_rows(tmp_path: Path) -> None:
    from agentloop.cli import main

    out = tmp_path / "t.jsonl"
    args = ["make-calc-traces", str(out), "--num", "3", "--num-compact", "2", "--digits", "2",
            "--sandbox", "fake"]  # fmt: skip
    assert main(args) == 0
    convs = load_conversations(out)
    assert len(convs) == 5
    assert sorted(c.num_assistant_turns for c in convs) == [2, 2, 2, 8, 8]


@pytest.mark.parametrize("digits", [2, 3, 5])
def test_expert_expression_answers_every_template(digits: int) -> None:
    for i in range(100):
        expert_expression(make_calc_task("test", i, digits=digits))  # raises if wrong
    with pytest.raises(EnvError, match="cannot script"):
        expert_expression(Task("t", {"prompt": "How many legs has a cat?", "answer": "4"}))


@pytest.mark.integration
def test_calc_traces_from_the_local_sandbox_match_the_fake_one() -> None:
    cfg = dict(num_traces=3, num_compact=1, questions_per_compact=2, typo_rate=0.3)
    local = asyncio.run(make_calc_traces(TraceConfig(sandbox="local", digits=2, **cfg)))
    assert local == _traces(**cfg)


# ---------------------------------------------------------------------- data
@pytest.fixture(scope="module")
def sft_tok(tokenizer: Any) -> SFTTokenizer:
    return SFTTokenizer(tokenizer)


def test_sft_ids_are_the_rollout_ids(sft_tok: SFTTokenizer, tokenizer: Any) -> None:
    """Invariant 1: what SFT trains on is what the rollout loop builds for the same turns."""
    from agentloop.engines.fake import FakeEngine
    from agentloop.rollout import RolloutConfig, rollout

    for row in _traces(num_traces=3):
        conv = parse_row(row, "row")
        builder = sft_tok.builder(conv.tools)
        texts = [m.content for m in sft_tok.model_messages(conv) if m.role == "assistant"]
        engine = FakeEngine(texts, tokenizer=tokenizer, eos_token_id=builder.stop_token_ids[0])
        task = make_calc_task("train", int(row["task_ids"][0].rsplit("-", 1)[1]), digits=2)
        env = make(ENV, digits=2, sandbox="fake")
        traj = asyncio.run(rollout(env, engine, builder, task, RolloutConfig(check_template=True)))
        ids, mask = sft_tok.ids_and_mask(conv)
        assert traj.reward == 1.0
        assert list(traj.token_ids) == ids
        assert list(traj.loss_mask) == mask


def test_loss_mask_is_exactly_the_assistant_turns(sft_tok: SFTTokenizer, tokenizer: Any) -> None:
    row = next(r for r in _traces(num_traces=0, num_compact=1, questions_per_compact=3))
    conv = parse_row(row, "row")
    ids, mask = sft_tok.ids_and_mask(conv)
    spans, cur = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            cur.append(i)
        elif cur:
            spans, cur = [*spans, cur], []
    spans += [cur] if cur else []
    texts = [m.content for m in sft_tok.model_messages(conv) if m.role == "assistant"]
    assert [tokenizer.decode(s) for s in spans] == [t + "<|im_end|>" for t in texts]
    builder = sft_tok.builder(None)
    builder.check_text(ids, sft_tok.model_messages(conv))  # the ids render the conversation
    assert "# Tools" not in tokenizer.decode(ids)  # compact rows: no tool schema in the prompt


def test_assistant_text_renders_openai_tool_calls(sft_tok: SFTTokenizer) -> None:
    builder = sft_tok.builder(None)
    call = ToolCall("python", {"code": "print(1 + 2)"}, id="call_0")
    rendered = (
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(1 + 2)"}}\n</tool_call>'
    )
    assert assistant_text(builder, Message("assistant", "", (call,))) == rendered
    with_text = assistant_text(builder, Message("assistant", "Let me compute.", (call,)))
    assert with_text == "Let me compute.\n" + rendered
    # agentloop's own trajectories keep the raw markup in content: taken as it is
    raw = Message("assistant", "Sure. " + rendered, (call,))
    assert assistant_text(builder, raw) == raw.content


_BAD_ROWS = [
    ([], "row: is a JSON list"),
    ({"messages": []}, "messages: is missing or empty"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role: is 'bot'"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content: is int"),
    ({"messages": [{"role": "user", "content": "q"}]}, "messages: has no assistant message"),
    ({"messages": [{"role": "assistant", "content": "a"}]}, "before any user message"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                   {"role": "tool", "content": "t"}]}, "messages[2]: is a 'tool' message"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                   {"role": "assistant", "content": "b"}]}, "follows another assistant"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None,
                    "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls[0].function.arguments: is not valid JSON"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                    "tool_calls": [{"function": {"arguments": {}}}]}]},
     "messages[1].tool_calls[0].function.name"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
      "tools": "python"}, "tools: is not a list of objects"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "expected"), _BAD_ROWS)
def test_bad_rows_name_the_row_field_and_fix(row: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_row(row, "data.jsonl:7")
    message = str(info.value)
    assert message.startswith("data.jsonl:7: ") and expected in message
    assert "; " in message  # problem; fix


def test_load_conversations_reports_the_line(tmp_path: Path) -> None:
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"messages": [good]}) + "\n")
    with pytest.raises(ConfigError, match=r"d\.jsonl:3: messages\[0\]\.role"):
        load_conversations(path)
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"d\.jsonl:2: row: is not valid JSON"):
        load_conversations(path)
    path.write_text(json.dumps(good) + "\n")
    assert len(load_conversations(path)) == 1


def test_holdout_split_is_seeded_and_disjoint() -> None:
    train, held = holdout_split(100, 0.1, seed=3)
    assert len(held) == 10 and not set(train) & set(held)
    assert sorted(train + held) == list(range(100))
    assert holdout_split(100, 0.1, seed=3) == (train, held) != holdout_split(100, 0.1, seed=4)
    assert holdout_split(5, 0.0, seed=0) == ([0, 1, 2, 3, 4], [])
    assert len(holdout_split(5, 0.01, seed=0)[1]) == 1


# ---------------------------------------------------------------------- recipe
def test_lr_lambda() -> None:
    from agentloop.trainers.sft import lr_lambda

    assert [lr_lambda(s, 10, 4, "cosine", 0.0) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_lambda(4, 10, 4, "cosine", 0.0) == 1.0
    assert lr_lambda(9, 10, 4, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_lambda(9, 10, 4, "linear", 0.0) == pytest.approx(0.0)
    assert lr_lambda(6, 10, 0, "linear", 0.0) == pytest.approx(1 - 6 / 9)
    assert lr_lambda(6, 12, 1, "cosine", 0.0) == pytest.approx(0.5)  # midway
    assert lr_lambda(99, 10, 0, "constant", 0.0) == 1.0


def test_sft_config_loads_and_names_bad_values(tmp_path: Path) -> None:
    from agentloop.trainers.config import example_config, load_config
    from agentloop.trainers.sft import SFTConfig

    cfg = load_config(SFTConfig, example_config("sft_calc_tiny"), ["trainer.batch_size=3"])
    assert cfg.trainer.batch_size == 3 and cfg.actor.lr == 1e-3 and cfg.actor.betas == (0.9, 0.95)
    for override, key in [("trainer.lr_schedule=step", "trainer.lr_schedule"),
                          ("actor.temperature=0.7", "actor.temperature"),
                          ("data.eval_fraction=1.5", "data.eval_fraction"),
                          ("trainer.epochs=0", "trainer.epochs")]:  # fmt: skip
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(SFTConfig, example_config("sft_calc_tiny"), [override])
    with pytest.raises(ConfigError, match=r"data\.train"):
        load_config(SFTConfig, None, [])


def test_sft_step_is_the_masked_mean_nll_whatever_the_packing(tiny_model: Any) -> None:
    from agentloop.trainers.packing import TrainSeq
    from agentloop.trainers.worker import PolicyWorker, WorkerConfig

    g = torch.Generator().manual_seed(0)
    seqs = []
    for n in (7, 12, 5, 9):
        mask = (torch.rand(n, generator=g) > 0.4).float()
        seqs.append(TrainSeq(torch.randint(0, 128, (n,), generator=g), mask, mask, torch.zeros(n)))
    ref = tiny_model(seed=1)
    logits = [ref(input_ids=s.token_ids[None], use_cache=False).logits[0] for s in seqs]
    nll = sum(-(torch.log_softmax(lg[:-1], -1).gather(1, s.token_ids[1:, None])[:, 0]
                * s.loss_mask[1:]).sum() for lg, s in zip(logits, seqs, strict=True))  # fmt: skip
    manual = float(nll.detach()) / sum(float(s.loss_mask[1:].sum()) for s in seqs)
    grads = []
    for budget in (8, 64):  # 4 micro-batches vs 1
        worker = PolicyWorker(tiny_model(seed=1), WorkerConfig(lr=1e-2, device="cpu",
                              grad_clip=0.0, max_tokens_per_micro_batch=budget))  # fmt: skip
        metrics = worker.sft_step(seqs)
        assert metrics["loss"] == pytest.approx(manual, rel=1e-5)
        assert metrics["tokens"] == sum(float(s.loss_mask[1:].sum()) for s in seqs)
        grads.append([p.grad.full_tensor().clone() for p in worker.model.parameters()])
    for a, b in zip(*grads, strict=True):  # the same gradients, whatever the micro-batching
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_run_sft_resumes_in_order_and_exports(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from agentloop.trainers.config import example_config, load_config
    from agentloop.trainers.metrics import read_metrics
    from agentloop.trainers.sft import SFTConfig, run_sft

    data = write_traces(_traces(num_traces=10, num_compact=2), tmp_path / "d.jsonl")

    def run(out: str, steps: int) -> Any:
        overrides = [f"data.train={data}", f"trainer.out_dir={tmp_path / out}",
                     f"model.path={tiny_model_dir}", f"trainer.max_steps={steps}",
                     "trainer.batch_size=2", "data.eval_fraction=0.2", "checkpoint.every=1",
                     "checkpoint.save_final=true",
                     "logging.progress=false", "logging.console=false"]  # fmt: skip
        return run_sft(load_config(SFTConfig, example_config("sft_calc_tiny"), overrides))

    straight = run("a", 4)
    run("b", 2)
    resumed = run("b", 4)
    assert straight.steps == resumed.steps == 4
    losses_a, losses_b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    for step in (1, 2, 3, 4):
        assert losses_b[step]["sft/loss"] == pytest.approx(losses_a[step]["sft/loss"], rel=1e-5)
    assert resumed.eval_loss_after == pytest.approx(straight.eval_loss_after, rel=1e-5)
    assert straight.eval_loss_before is not None and straight.eval_loss_after is not None
    assert straight.eval_loss_after < straight.eval_loss_before
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir())[-1] == "step_00000004"
    export = resumed.export_dir
    assert export is not None and (export / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(export)
    assert not math.isnan(float(next(model.parameters()).sum()))


def _sft_rank(rank: int, world: int, overrides: list[str]) -> dict[int, dict[str, float]] | None:
    from agentloop.trainers.config import example_config, load_config
    from agentloop.trainers.metrics import read_metrics
    from agentloop.trainers.sft import SFTConfig, run_sft

    result = run_sft(load_config(SFTConfig, example_config("sft_calc_tiny"), overrides))
    return read_metrics(result.out_dir) if rank == 0 else None


@pytest.mark.slow
def test_run_sft_on_two_ranks_matches_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    """torchrun-style DP: each rank trains on its share of every batch; the losses and held-out
    losses are those of one process."""
    from agentloop.trainers.dist import run_local_ranks

    data = write_traces(_traces(num_traces=8, num_compact=2), tmp_path / "d.jsonl")

    def overrides(out: str) -> list[str]:
        return [f"data.train={data}", f"trainer.out_dir={tmp_path / out}",
                f"model.path={tiny_model_dir}", "trainer.max_steps=3", "trainer.batch_size=2",
                "data.eval_fraction=0.2", "checkpoint.export_final=false",
                "logging.progress=false", "logging.console=false"]  # fmt: skip

    one = _sft_rank(0, 1, overrides("one"))
    two = run_local_ranks(_sft_rank, 2, overrides("two"))[0]
    assert one is not None and two is not None
    for step in (0, 1, 2, 3):
        for key in ("sft/loss", "val/loss"):
            if key in one[step]:
                assert two[step][key] == pytest.approx(one[step][key], rel=1e-5), (step, key)
    assert "val/loss" in one[0] and "val/loss" in one[3]
