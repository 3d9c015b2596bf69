"""Run guards: stop after N steps whose rollouts all failed; warn on a rising tool-error rate."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentloop.errors import AgentLoopError
from agentloop.types import Trajectory

__all__ = ["RolloutsFailedError", "RunGuard", "rollout_failed"]

log = logging.getLogger(__name__)

# Tool errors that say a service failed (the sandbox, a search server), not that the model called
# a tool wrongly (invalid_json, unknown_tool, invalid_arguments: the policy's to learn from).
_SERVICE_ERRORS = ("tool_error/tool_exception", "tool_error/timeout")


class RolloutsFailedError(AgentLoopError):
    """Every rollout of several consecutive steps failed: training on them teaches nothing."""


def rollout_failed(t: Trajectory) -> bool:
    """An episode that failed for the run's services rather than the policy: an error stop
    reason (engine, env, timeout, fatal tool), or tool calls that all failed with a tool
    exception or a timeout (a dead sandbox turns every call into one)."""
    if t.stop_reason.is_error:
        return True
    calls = t.metrics.get("tool_calls", 0.0)
    return calls > 0 and sum(t.metrics.get(k, 0.0) for k in _SERVICE_ERRORS) >= calls


def _first_error(trajs: Sequence[Trajectory]) -> str:
    for t in trajs:
        if t.error:
            return f"{t.stop_reason.value}: {t.error}"
    for t in trajs:
        for m in t.messages:
            if m.role == "tool" and str(m.content).startswith("Error:"):
                return str(m.content)[:500]
    return "(no error text)"


@dataclass
class RunGuard:
    """Watches each step's rollouts: after ``max_failed_steps`` consecutive steps whose rollouts
    all failed (0: never; episodes that called no tool are not counted either way),
    ``should_stop`` is true and ``stop`` gives the run's error; a warning is logged when a
    step's tool-error rate rises ``warn_rise`` above the run's mean so far."""

    max_failed_steps: int
    warn_rise: float = 0.25
    failed_streak: int = 0
    _rates: list[float] = field(default_factory=list)
    _warned: bool = False

    def check(
        self, step: int, trajs: Sequence[Trajectory], tool_error_rate: float
    ) -> dict[str, float]:
        """Watch one step (count a failed one, warn on rising tool errors); returns its
        ``rollout/failed_frac`` metric."""
        self._watch_tool_errors(step, tool_error_rate)
        failed = sum(rollout_failed(t) for t in trajs)
        # an episode that called no tool shows nothing either way (with a dead sandbox the
        # model may still answer some prompts without it)
        silent = sum(not rollout_failed(t) and not t.metrics.get("tool_calls") for t in trajs)
        metrics = {"rollout/failed_frac": failed / len(trajs) if trajs else 0.0}
        if failed and failed + silent == len(trajs):
            self.failed_streak += 1
            log.warning("step %d: every rollout failed: %s", step, _first_error(trajs))
        else:
            self.failed_streak = 0
        return metrics

    @property
    def should_stop(self) -> bool:
        """``max_failed_steps`` consecutive steps have failed (see :meth:`stop`)."""
        return 0 < self.max_failed_steps <= self.failed_streak

    def stop(self, step: int, trajs: Sequence[Trajectory]) -> RolloutsFailedError:
        """The error that ends the run: the streak, the stop reasons and the first error."""
        reasons = Counter(t.stop_reason.value for t in trajs)
        breakdown = ", ".join(f"{k} {v}" for k, v in reasons.most_common())
        return RolloutsFailedError(
            f"stopping at step {step}: the rollouts of the last {self.failed_streak} steps "
            f"all failed (stop reasons at step {step}: {breakdown}; first error: "
            f"{_first_error(trajs)}). Check the services the env uses (sandbox servers, "
            "search, the engine), or raise trainer.max_failed_steps (0: never stop)"
        )

    def _watch_tool_errors(self, step: int, rate: float) -> None:
        if self.warn_rise > 0 and self._rates:
            mean = sum(self._rates) / len(self._rates)
            rising = rate >= mean + self.warn_rise
            if rising and not self._warned:
                log.warning(
                    "step %d: the tool-error rate rose to %.2f (run mean so far %.2f); a tool's "
                    "service (sandbox, search) may be failing",
                    step,
                    rate,
                    mean,
                )
            self._warned = rising
        self._rates.append(rate)
