"""verl's side of the multi variant: an agent loop of 3 turns with a fixed user message between
them, registered through verl's own extension point (``actor_rollout_ref.rollout.agent.
agent_loop_config_path``, a YAML list of ``{name, _target_, kwargs}`` that each
``AgentLoopWorker`` instantiates with Hydra; ``agent.default_agent_loop`` picks it).

verl 0.9.1 has no interactions any more (no ``multi_turn.interaction_config_path``), and its
``tool_agent`` loop goes on only after a parsed tool call and caps the whole response, not a
turn: with a random-init model every episode would end after one turn. This loop uses verl's
own pieces for each turn: its server manager's ``generate`` (the vLLM replicas, with the turn
cap as the request's ``max_tokens`` and ``rollout.ignore_eos``), and its Continuous Token
builder to append the sampled ids (``ct_merge_assistant_token``: mask 1, logprobs kept) and to
render the user message as the chat template does (``ct_merge_context_msg``: mask 0).

Importable only where verl is (its Ray workers: ``verl_grpo.py`` puts this folder on their
``PYTHONPATH``).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from results import VERL_UNSAMPLED_TAG  # bench/peers is on sys.path
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.profiler import simple_timer
from workload import tool_result_text


class RaceAgentLoop(AgentLoopBase):
    """``turns`` assistant turns of at most ``turn_tokens`` tokens each; after each but the last,
    a user message of ``tool_tokens`` fixed tokens, whatever the model wrote."""

    # verl's responses hold the observation tokens too (its ``response_length/mean`` counts
    # them): one line per worker process says how many, so results.parse_verl counts sampled only
    reported = False

    def __init__(
        self, *args: Any, turns: int = 3, turn_tokens: int = 170, tool_tokens: int = 64, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.turns, self.turn_tokens = turns, turn_tokens
        self.observation = tool_result_text(tool_tokens)
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        metrics: dict[str, Any] = {}
        ids = await self.ct_build_initial_tokens(messages)
        mask: list[int] = []
        logps: list[float] = []
        extra: dict[str, Any] = {}  # the server's: the weight versions the episode ran on
        params = {**sampling_params, "max_tokens": self.turn_tokens}
        request_id = uuid4().hex  # one per episode: its turns go to the same replica
        for turn in range(self.turns):
            if turn:
                before = list(messages)
                messages.append({"role": "user", "content": self.observation})
                merged, mask, lps = await self.ct_merge_context_msg(
                    before, messages, ids, mask, logps or None
                )
                ids, logps = merged.token_ids, lps or []
            with simple_timer("generate_sequences", metrics):
                out = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=ids, sampling_params=params
                )
            merged, mask, lps = await self.ct_merge_assistant_token(
                ids, out.token_ids, mask, logps if (logps or out.log_probs) else None,
                assistant_logprobs=out.log_probs or None,
            )  # fmt: skip
            ids, logps = merged.token_ids, lps or []
            extra = {**out.extra_fields, **extra}  # the first turn's min_global_steps stays
            if "max_global_steps" in out.extra_fields:  # and the last turn's max
                extra["max_global_steps"] = out.extra_fields["max_global_steps"]
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
        self._report(len(mask) - sum(mask))
        n = self.response_length
        return AgentLoopOutput(
            prompt_ids=ids[: len(ids) - len(mask)], response_ids=ids[len(ids) - len(mask) :][:n],
            response_mask=mask[:n], response_logprobs=logps[:n] or None, multi_modal_data={},
            num_turns=2 * self.turns, metrics=metrics,
            extra_fields={**extra, "turn_scores": [], "tool_rewards": []},
        )  # fmt: skip

    def _report(self, unsampled: int) -> None:
        if not RaceAgentLoop.reported:
            RaceAgentLoop.reported = True
            print(f"{VERL_UNSAMPLED_TAG}{unsampled}", flush=True)
