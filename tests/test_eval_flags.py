"""``agentloop eval``'s rollout flags come from ``RolloutConfig``: one per field, named after it,
typed as it, helped by its docstring; set flags reach the ``EvalConfig``, unset ones keep the
defaults."""

from __future__ import annotations

import dataclasses

import pytest

from agentloop.cli import build_parser
from agentloop.cli.evaluate import rollout_config
from agentloop.config_docs import field_docs
from agentloop.rollout import RolloutConfig

BASE = ["eval", "--env", "agentloop/Calc-v0", "--model", "some/dir", "--out", "run"]


def _options() -> dict[str, object]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if a.dest == "command")
    evaluate = sub.choices["eval"]  # type: ignore[index]
    return {o: a for a in evaluate._actions for o in a.option_strings}


def test_every_rollout_field_is_a_flag_with_its_docstring() -> None:
    options = _options()
    docs = field_docs(RolloutConfig)
    for f in dataclasses.fields(RolloutConfig):
        action = options["--" + f.name.replace("_", "-")]
        first = " ".join(docs[f.name].split()).replace("``", "")[:40]
        assert first in action.help, (f.name, action.help)  # type: ignore[attr-defined]
        assert action.default is None  # type: ignore[attr-defined]
    # the flags the eval command always had keep their names
    for name in ("--max-turns", "--max-prompt-len", "--max-response-len", "--timeout-s",
                 "--max-tool-output-tokens", "--temperature", "--top-p", "--top-k", "--parser",
                 "--thinking"):  # fmt: skip
        assert name in options


def test_set_flags_reach_the_rollout_config_and_unset_ones_keep_the_defaults() -> None:
    args = build_parser().parse_args(
        [*BASE, "--max-turns", "3", "--top-p", "0.5", "--thinking", "keep", "--check-template"]
    )
    rollout = rollout_config(args)
    assert rollout == RolloutConfig(max_turns=3, top_p=0.5, thinking="keep", check_template=True)
    assert rollout_config(build_parser().parse_args(BASE)) == RolloutConfig()


def test_a_flag_of_the_wrong_type_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*BASE, "--max-turns", "two"])
    assert "--max-turns: invalid int value: 'two'" in capsys.readouterr().err
