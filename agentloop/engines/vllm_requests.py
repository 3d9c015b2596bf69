"""Requests and outputs between agentloop's types and vLLM's: sampling, completions, errors."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agentloop.engines.base import SamplingParams
from agentloop.errors import InferenceError
from agentloop.types import Completion, FinishReason

__all__ = ["BAN_BIAS", "completion", "inference_error", "vllm_sampling"]

_FINISH: Mapping[str, FinishReason] = MappingProxyType(
    {"stop": "stop", "length": "length", "abort": "abort"}
)
# The logit bias that bans a token: vLLM's lowest (it clamps logit_bias to [-100, 100]). Applied
# before temperature and top-k/p, it puts a banned token e^-100 (3.7e-44) below an unbanned one of
# equal logit: never sampled, and in float32 the logprobs of the other tokens are those of a -inf
# ban unless a banned logit is ~84 above every unbanned one. logit_bias is the one public way to
# ban ids that both of vLLM's model runners take (V2 caps allowed_token_ids at 1024 ids, too few
# for "all but these"; custom logits processors have different interfaces in V1 and V2).
BAN_BIAS = -100.0


def vllm_sampling(sampling: SamplingParams) -> Any:
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        n=1,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=0 if sampling.top_k == -1 else sampling.top_k,
        seed=sampling.seed,
        stop_token_ids=list(sampling.stop_token_ids),
        logprobs=0,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
        logit_bias=dict.fromkeys(sampling.banned_token_ids, BAN_BIAS) or None,
    )


def completion(out: Any, request_id: str) -> Completion:
    reason = _FINISH.get(out.finish_reason or "")
    if reason is None:
        raise InferenceError(
            f"vLLM request {request_id} ended with finish reason {out.finish_reason!r} "
            f"(stop reason {out.stop_reason!r}); expected stop, length or abort"
        )
    ids = [int(t) for t in out.token_ids]
    entries = out.logprobs or []
    if len(entries) != len(ids):
        raise InferenceError(
            f"vLLM returned {len(ids)} tokens but {len(entries)} logprob entries for request "
            f"{request_id}"
        )
    try:
        logprobs = [entries[i][tok].logprob for i, tok in enumerate(ids)]
    except KeyError as e:
        raise InferenceError(
            f"vLLM returned no logprob for sampled token {e} of request {request_id}"
        ) from e
    return Completion(token_ids=tuple(ids), logprobs=tuple(logprobs), finish_reason=reason)


def inference_error(e: Exception, prompt_len: int) -> InferenceError:
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(e, EngineDeadError):
        return InferenceError(
            "the vLLM engine process died (see its log above for the cause); restart the engine"
        )
    if isinstance(e, VLLMValidationError | ValueError):
        return InferenceError(f"vLLM rejected a {prompt_len}-token prompt: {e}")
    cause = e.__cause__ or e
    return InferenceError(f"vLLM generation failed: {type(cause).__name__}: {cause}")
