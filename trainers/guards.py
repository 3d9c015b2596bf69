"""Run guards: stop after N steps whose rollouts all failed; warn on a rising tool-error rate."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentloop.errors import AgentLoopError
from agentloop.types import Trajectory

__all__ = ["RolloutsFailedError", "RunGuard"]

log = logging.getLogger(__name__)


class RolloutsFailedError(AgentLoopError):
    """Every rollout of several consecutive steps failed: training on them teaches nothing."""


def _tools_worked(t: Trajectory) -> bool:
    """At least one tool call of the episode gave a result: the tools' services work."""
    return t.metrics.get("tool_calls", 0.0) > t.metrics.get("tool_errors", 0.0)


def _first_error(trajs: Sequence[Trajectory]) -> str:
    """The first failed rollout's error: its stop's, else its first failed tool call's."""
    failed = [t for t in trajs if t.service_failed]
    for t in failed:
        if t.stop_reason.is_error and t.error:
            return f"{t.stop_reason.value}: {t.error}"
    for t in failed:
        for m in t.messages:  # the dispatcher's words for a tool exception or a timeout
            if m.role == "tool" and str(m.content).startswith("Error: tool "):
                return str(m.content)[:500]
    return "(no error text)"


@dataclass
class RunGuard:
    """Watches each step's rollouts: after ``max_failed_steps`` steps whose rollouts all failed
    (0: never), with no step between them where they worked, ``should_stop`` is true and
    ``stop`` gives the run's error; a warning is logged when a step's tool-error rate rises
    ``warn_rise`` above the run's mean so far.

    A step *failed* when some rollout failed (``Trajectory.service_failed``) and no tool call of the
    step gave a result; it *worked* when a tool call did, or when nothing failed and no tool
    was called. A step whose only calls were malformed (the policy's errors) shows nothing
    either way: with a dead sandbox a policy still garbles, or answers, some prompts."""

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
        failed = sum(t.service_failed for t in trajs)
        metrics = {"rollout/failed_frac": failed / len(trajs) if trajs else 0.0}
        worked = any(_tools_worked(t) for t in trajs)
        if failed and not worked:
            self.failed_streak += 1
            log.warning("step %d: every rollout failed: %s", step, _first_error(trajs))
        elif worked or not any(t.metrics.get("tool_calls") for t in trajs):
            self.failed_streak = 0  # the tools worked, or nothing failed and none were called
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
