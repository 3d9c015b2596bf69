"""Model-family formats: each family's template on the tiny tokenizer gives token-exact
episodes whose tool calls (in that family's syntax) are parsed and dispatched, the parser
picked automatically from the template."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentloop.chat import TokenBuilder
from agentloop.engines.fake import FakeEngine
from agentloop.envs import ToolEnv
from agentloop.errors import ToolError
from agentloop.formats import FAMILIES
from agentloop.rollout import RolloutConfig, rollout
from agentloop.testing.families import wear_family
from agentloop.tools import ToolSchemas, detect_parser, get_parser, resolve_parser, tool
from agentloop.types import Message, StopReason, Task, Trajectory


@tool
def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: What to echo.
    """
    return f"echo: {text}"


def boxed_reward(task: Task, messages: Sequence[Message]) -> float:
    return float("\\boxed{4}" in messages[-1].content)


def make_env() -> ToolEnv:
    return ToolEnv([echo], boxed_reward, system_prompt="Use tools.")


#: Per family: a reply with a tool call of echo(text="hi"), then a final answer, each ending
#: with the stop token that family's checkpoints sample there.
EPISODES: dict[str, tuple[str, str]] = {
    "hermes": (
        '<tool_call>\n{"name": "echo", "arguments": {"text": "hi"}}\n</tool_call><|im_end|>',
        "It is \\boxed{4}<|im_end|>",
    ),
    "llama3": (
        '<|python_tag|>{"name": "echo", "parameters": {"text": "hi"}}<|eom_id|>',
        "It is \\boxed{4}<|eot_id|>",
    ),
    "mistral": ('[TOOL_CALLS]echo[ARGS]{"text": "hi"}</s>', "It is \\boxed{4}</s>"),
    "harmony": (
        "<|channel|>analysis<|message|>Echo first.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.echo <|constrain|>json<|message|>{"text": "hi"}<|call|>',
        "<|channel|>final<|message|>It is \\boxed{4}<|return|>",
    ),
    "glm45": (
        "<think>Echo first.</think>\n<tool_call>echo\n<arg_key>text</arg_key>\n"
        "<arg_value>hi</arg_value>\n</tool_call><|observation|>",
        "<think></think>\nIt is \\boxed{4}<|user|>",
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=echo>\n<parameter=text>\nhi\n</parameter>\n</function>\n"
        "</tool_call><|im_end|>",
        "It is \\boxed{4}<|im_end|>",
    ),
    "deepseek_v3": (
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>echo<｜tool▁sep｜>{"text": "hi"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        "It is \\boxed{4}<｜end▁of▁sentence｜>",
    ),
}


@pytest.fixture(scope="module")
def family_tokenizers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("families")
    return {
        name: AutoTokenizer.from_pretrained(wear_family(tiny_model_dir, name, root / name))
        for name in FAMILIES
    }


def test_every_family_has_an_episode() -> None:
    assert set(EPISODES) == set(FAMILIES)


def assert_token_exact(traj: Trajectory, engine: FakeEngine) -> None:
    """Ids == prompt + each sampled run + each observation suffix; mask 1 exactly on sampled
    ids, which carry the engine's logprobs."""
    requests = engine.requests
    assert list(requests[0].prompt_ids) == list(traj.token_ids[: traj.prompt_len])
    mask: list[int] = []
    for req in requests:
        assert traj.token_ids[: len(req.prompt_ids)] == req.prompt_ids
        mask += [0] * (len(req.prompt_ids) - len(mask))
        end = len(req.prompt_ids) + len(req.completion.token_ids)
        assert traj.token_ids[len(req.prompt_ids) : end] == req.completion.token_ids
        assert traj.logprobs[len(req.prompt_ids) : end] == req.completion.logprobs
        mask += [1] * len(req.completion.token_ids)
    assert list(traj.loss_mask) == mask


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_episode_is_token_exact_parsed_and_dispatched(
    name: str, family_tokenizers: dict[str, Any]
) -> None:
    tok = family_tokenizers[name]
    env = make_env()
    builder = TokenBuilder(tok, tools=env.tool_schemas)
    assert builder.parser_for("auto") == FAMILIES[name].parser  # auto-selected from the template
    engine = FakeEngine(list(EPISODES[name]), tokenizer=tok)
    traj = asyncio.run(
        rollout(env, engine, builder, Task("t", {"prompt": "2+2?"}), RolloutConfig())
    )
    assert traj.stop_reason is StopReason.DONE, traj.error
    assert len(traj.turns) == 2
    call = traj.messages[2].tool_calls
    assert [(c.name, dict(c.arguments), c.parse_error) for c in call] == [
        ("echo", {"text": "hi"}, None)
    ]
    assert traj.turns[0].tool_calls == 1 and traj.turns[0].tool_errors == 0
    assert traj.messages[3].role == "tool" and traj.messages[3].content == "echo: hi"
    assert traj.reward == 1.0 and traj.turn_rewards == (0.0, 1.0)
    assert_token_exact(traj, engine)
    builder.check_text(traj.token_ids, traj.messages)  # the ids are the template's rendering


def test_explicit_parser_wins_and_unknown_template_with_tools_is_an_error(
    family_tokenizers: dict[str, Any],
) -> None:
    tmpl = FAMILIES["llama3"].chat_template
    assert resolve_parser("hermes", tmpl, has_tools=True) == "hermes"
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert detect_parser(plain) is None
    assert resolve_parser("auto", plain, has_tools=False) == "hermes"
    with pytest.raises(ToolError, match=r"rollout.parser=auto.*llama3_json.*mistral"):
        resolve_parser("auto", plain, has_tools=True)


@pytest.mark.parametrize(
    ("parser", "text", "expected"),
    [
        (
            "llama3_json",
            '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
            [("a", {"x": 1}), ("b", {})],
        ),
        ("llama3_json", "just an answer", []),
        ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}]', [("a", {"x": 1})]),
        (
            "mistral",
            '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}',
            [("a", {"x": 1}), ("b", {})],
        ),
        (
            "glm45",
            "<tool_call>a\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n"
            "<arg_key>s</arg_key>\n<arg_value>two words</arg_value>\n</tool_call>",
            [("a", {"x": 1, "s": "two words"})],
        ),
        (
            "qwen3_coder",
            "<tool_call>\n<function=a>\n<parameter=code>\nprint(1)\n</parameter>\n"
            "</function>\n</tool_call>",
            [("a", {"code": "print(1)"})],
        ),
        (
            "deepseek_v3",
            '<｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{"x": 1}\n```'
            "<｜tool▁call▁end｜>",
            [("a", {"x": 1})],
        ),
        ("harmony", "<|channel|>final<|message|>no call<|return|>", []),
    ],
)
def test_parsers_read_their_format(parser: str, text: str, expected: list[Any]) -> None:
    schema = {"properties": {"x": {"type": "integer"}, "s": {"type": "string"}}}
    tools = ToolSchemas.of([{"name": "a", "parameters": schema}])  # types glm45's bare "1"
    calls = get_parser(parser).parse(text, tools)
    assert [(c.name, dict(c.arguments)) for c in calls] == expected
    assert all(c.parse_error is None for c in calls)


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("llama3_json", '{"name": "a", "parameters": {"x": '),
        ("mistral", "[TOOL_CALLS]a[ARGS]{oops}"),
        (
            "harmony",
            "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{bad<|call|>",
        ),
        ("glm45", "<tool_call>a\n<arg_key>x</arg_key>"),
        ("qwen3_coder", "<tool_call>\n<function=a>\n<parameter=x>\n1\n"),
        ("deepseek_v3", "<｜tool▁call▁begin｜>a<｜tool▁sep｜>{bad}<｜tool▁call▁end｜>"),
    ],
)
def test_a_broken_call_is_an_error_call_not_dropped(parser: str, text: str) -> None:
    calls = get_parser(parser).parse(text)
    assert len(calls) == 1 and calls[0].parse_error


@pytest.mark.slow
def test_agentloop_eval_picks_the_parser_from_a_family_template(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import json

    from agentloop.cli import main

    model = wear_family(tiny_model_dir, "llama3", tmp_path / "llama3")
    (model / "model.safetensors").symlink_to(tiny_model_dir / "model.safetensors")
    args = ["eval", "--env", "agentloop/Calc-v0", "--model", str(model), "--engine", "hf",
            "--quiet", "--n", "1", "--num-tasks", "1", "--max-response-len", "16"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "run")]) == 0
    from agentloop.eval import _sha256

    parser_part = json.loads((tmp_path / "run" / "config.json").read_text())["config_parts"]
    resolved = ["llama3_json", "agentloop.tools.family_parsers.Llama3JsonParser"]
    assert parser_part["parser"] == _sha256(resolved)  # the run records the resolved parser
    tok = json.loads((model / "tokenizer_config.json").read_text())
    tok["chat_template"] = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps(tok))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    assert main([*args, "--out", str(tmp_path / "bad")]) == 2  # named error, not a default


@tool
def repeat(text: str, times: int) -> str:
    """Repeat the text.

    Args:
        text: What to repeat.
        times: How many times.
    """
    return text * times


@pytest.mark.parametrize(
    ("name", "call"),
    [
        (
            "glm45",
            "<tool_call>repeat\n<arg_key>text</arg_key>\n<arg_value>42</arg_value>\n"
            "<arg_key>times</arg_key>\n<arg_value>2</arg_value>\n</tool_call><|observation|>",
        ),
        (
            "qwen3_coder",
            "<tool_call>\n<function=repeat>\n<parameter=text>\n42\n</parameter>\n"
            "<parameter=times>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>",
        ),
    ],
)
def test_the_rollout_types_xml_values_by_the_tools_schema(
    name: str, call: str, family_tokenizers: dict[str, Any]
) -> None:
    tok = family_tokenizers[name]
    env = ToolEnv([repeat], boxed_reward, system_prompt="Use tools.")
    builder = TokenBuilder(tok, tools=env.tool_schemas)
    engine = FakeEngine([call, EPISODES[name][1]], tokenizer=tok)
    traj = asyncio.run(
        rollout(env, engine, builder, Task("t", {"prompt": "2+2?"}), RolloutConfig())
    )
    # typed by repeat's schema: the bare 42 stays the string "42" (issue 41), 2 is the int 2
    assert [dict(c.arguments) for c in traj.messages[2].tool_calls] == [{"text": "42", "times": 2}]
    assert traj.turns[0].tool_errors == 0 and traj.messages[3].content == "4242"
