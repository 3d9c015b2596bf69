"""Calc agents written with agent frameworks (OpenAI Agents SDK, LangChain) for the proxy's tests.

``agents_sdk_calc_agent`` is an OpenAI Agents SDK ``Agent`` on the SDK's default model class,
``OpenAIResponsesModel``: it speaks ``/v1/responses``. ``langchain_calc_agent`` is a tool loop
around langchain-openai's ``ChatOpenAI`` (``/v1/chat/completions``). Both declare Calc-v0's
``python`` tool exactly as :data:`~agentloop.testing.calc_agent.CALC_TOOLS` does and run it with
:func:`~agentloop.testing.calc_agent.run_python`, so the model sees the prompt the Calc tool
caller was taught on. Play them with ``agentloop eval --env agentloop/Agent-v0 --env-arg
agent=agentloop.testing.framework_agents:agents_sdk_calc_agent``.
"""

from __future__ import annotations

import json
from typing import Any

from agentloop.envs.calc import SYSTEM_PROMPT
from agentloop.testing.calc_agent import CALC_TOOLS, MAX_TURNS, run_python
from agentloop.types import Task

__all__ = ["agents_sdk_calc_agent", "agents_sdk_streamed_calc_agent", "langchain_calc_agent"]


def _sdk_agent(client: Any) -> Any:
    from agents import Agent, FunctionTool, OpenAIResponsesModel

    spec = CALC_TOOLS[0]["function"]

    async def invoke(ctx: Any, arguments: str) -> str:
        try:
            code = json.loads(arguments or "{}").get("code", "")
        except (ValueError, AttributeError):
            return "Error: arguments are not a JSON object"
        return run_python(str(code))

    python = FunctionTool(
        name=spec["name"],
        description=spec["description"],
        params_json_schema=spec["parameters"],
        on_invoke_tool=invoke,
        strict_json_schema=False,  # the schema as declared: strict mode rewrites it
    )
    model = OpenAIResponsesModel(model="agentloop", openai_client=client)
    return Agent(name="calc", instructions=SYSTEM_PROMPT, tools=[python], model=model)


async def agents_sdk_calc_agent(task: Task, client: Any) -> str:
    """An Agents SDK agent run to its final output; ``client`` is an ``openai.AsyncOpenAI``.
    The model's own misbehaviour (a call to a tool it was not given, too many turns) ends the
    run with no answer, as :func:`~agentloop.testing.calc_agent.calc_agent` does: an episode
    scored 0, not a failed one."""
    from agents import MaxTurnsExceeded, ModelBehaviorError, RunConfig, Runner

    config = RunConfig(tracing_disabled=True)
    try:
        result = await Runner.run(
            _sdk_agent(client), str(task.data["prompt"]), max_turns=MAX_TURNS, run_config=config
        )
    except (MaxTurnsExceeded, ModelBehaviorError):
        return ""
    return str(result.final_output or "")


async def agents_sdk_streamed_calc_agent(task: Task, client: Any) -> str:
    """:func:`agents_sdk_calc_agent`, streamed (``Runner.run_streamed``: Responses events)."""
    from agents import MaxTurnsExceeded, ModelBehaviorError, RunConfig, Runner

    config = RunConfig(tracing_disabled=True)
    run = Runner.run_streamed(
        _sdk_agent(client), str(task.data["prompt"]), max_turns=MAX_TURNS, run_config=config
    )
    try:
        async for _ in run.stream_events():
            pass
    except (MaxTurnsExceeded, ModelBehaviorError):
        return ""
    return str(run.final_output or "")


async def langchain_calc_agent(task: Task, client: Any) -> str:
    """A LangChain tool loop: ``ChatOpenAI.bind_tools`` asks, ``ToolMessage`` answers, until a
    reply has no tool calls."""
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model="agentloop",
        base_url=str(client.base_url),
        api_key=client.api_key,
        max_retries=0,
        timeout=client.timeout,
    ).bind_tools(CALC_TOOLS)
    messages: list[Any] = [SystemMessage(SYSTEM_PROMPT), HumanMessage(str(task.data["prompt"]))]
    for _ in range(MAX_TURNS):
        reply = await llm.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return str(reply.content or "")
        for call in reply.tool_calls:
            output = run_python(str(call["args"].get("code", "")))
            messages.append(ToolMessage(output, tool_call_id=call["id"]))
    return ""
