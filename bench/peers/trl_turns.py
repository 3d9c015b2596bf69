"""TRL's side of the multi variant: 3-turn episodes through ``GRPOTrainer(rollout_func=...)``,
TRL 1.16's hook for rollouts it does not run itself.

TRL's own multi-turn path (``tools`` / ``environment_factory``) goes on to another turn only
when it parses a tool call out of the reply, and caps the whole completion, not a turn: a
random-init model writes no tool calls, so the episode would end after one turn. The
``rollout_func`` here runs every turn on TRL's colocated engine (``trainer.vllm_generation``,
timed by TRL's ``profiling_context`` as ``vLLM.generate``), each turn capped at
``turn_tokens`` by the vLLM ``max_tokens`` that ``generation_kwargs`` sets over TRL's
(``ignore_eos`` too), and between two turns it appends the fixed user message as the chat
template renders it after an assistant turn (the cut turn's closing, the message, the next
assistant header), with ``env_mask`` 0 there, which TRL multiplies into its loss mask. The whole
rollout is timed as ``rollout_func`` (generation, as agentloop's and verl's include their loops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workload import Workload, tool_result_text  # bench/peers is on sys.path

_MARK = "@@RACE-TURN@@"


def observation_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids that follow a cut assistant turn up to the next one's first sampled token: the
    chat template's rendering after an assistant message, with a user message ``text``."""
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK},
            {"role": "user", "content": text}]  # fmt: skip
    rendered = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    suffix = rendered[rendered.index(_MARK) + len(_MARK) :]
    return list(tokenizer.encode(suffix, add_special_tokens=False))


def generate_turn(
    trainer: Any, contexts: list[list[int]], max_tokens: int
) -> tuple[list[list[int]], list[list[float]] | None]:
    """One turn of every episode: sampled ids and their logprobs. On vLLM (the race) through
    TRL's own engine call; ``generation_kwargs`` holds the turn cap. On a CPU smoke run (no
    vLLM) with transformers' ``generate``, exactly ``max_tokens`` a turn and no logprobs."""
    from trl.extras.profiling import profiling_context

    if trainer.use_vllm:
        _, ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=contexts, images=None, num_generations=trainer.num_generations,
            profiler=profiling_context(trainer, "vLLM.generate"),
        )  # fmt: skip
        return [list(x) for x in ids], [[lp[0] for lp in seq] for seq in logprobs]
    import torch

    out = []
    with profiling_context(trainer, "transformers.generate"), torch.no_grad():
        for ctx in contexts:
            ids = torch.tensor([ctx], device=trainer.model.device)
            gen = trainer.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                min_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
            )  # fmt: skip
            out.append(gen[0, len(ctx) :].tolist())
    return out, None


def make_rollout_func(w: Workload) -> Callable[[list[Any], Any], dict[str, Any]]:
    """GRPOTrainer's ``rollout_func`` for ``w``: ``w.turns`` turns of ``w.turn_tokens`` each, the
    fixed observation between two turns masked out (``env_mask``)."""

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        from trl.extras.profiling import profiling_context

        tok = trainer.processing_class
        obs = observation_ids(tok, tool_result_text(w.tool_tokens))
        prompt_ids = [
            list(tok.apply_chat_template(p, add_generation_prompt=True, return_dict=False))
            for p in prompts
        ]
        done: list[list[int]] = [[] for _ in prompts]
        mask: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] | None = [[] for _ in prompts]
        with profiling_context(trainer, "rollout_func"):
            for turn in range(w.turns):
                if turn:
                    for i in range(len(prompts)):
                        done[i] += obs
                        mask[i] += [0] * len(obs)
                        if logps is not None:
                            logps[i] += [0.0] * len(obs)
                contexts = [p + c for p, c in zip(prompt_ids, done, strict=True)]
                ids, lps = generate_turn(trainer, contexts, w.turn_tokens)
                for i, sampled in enumerate(ids):
                    done[i] += sampled
                    mask[i] += [1] * len(sampled)
                logps = None if lps is None or logps is None else [
                    a + b for a, b in zip(logps, lps, strict=True)]  # fmt: skip
        return {"prompt_ids": prompt_ids, "completion_ids": done, "logprobs": logps,
                "env_mask": mask}  # fmt: skip

    return rollout_func
