"""Start-up mistakes a new user makes get one line naming the value and the fix, exit 2.

Each case goes through the CLI as a user meets it: a model directory without a tokenizer, a busy
``--port`` on every server command, a missing ``--corpus`` file, a YAML file that is empty or whose
top level is a list, ``make-tiny-model`` onto a file, and ``train --print-config`` running the
checks ``train`` runs before its first episode.
"""

from __future__ import annotations

import importlib.util
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentloop.cli import main


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], match: str) -> str:
    """``agentloop ARGV`` exits 2 with one line matching ``match`` (and no traceback)."""
    import re

    assert main(argv) == 2
    captured = capsys.readouterr()
    said = (captured.err + captured.out).strip().splitlines()
    assert "Traceback" not in captured.err
    assert any(re.search(match, line) for line in said), said
    return said[-1]


@pytest.fixture
def no_tokenizer(tmp_path: Path) -> Path:
    """A directory that looks like a model but holds no tokenizer (a config.json only)."""
    model = tmp_path / "half_downloaded"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port that another process (here: this one) listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


NO_TOKENIZER = r"is not a model directory: it has no tokenizer \(none of tokenizer\.json.*copy the"


def test_a_model_dir_without_a_tokenizer_is_named_in_eval_train_and_serve_proxy(
    no_tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(no_tokenizer)
    eval_args = ["eval", "--env", "agentloop/Calc-v0", "--model", model, "--out",
                 str(tmp_path / "run"), "--quiet"]  # fmt: skip
    _fails(
        eval_args,
        capsys,
        rf"--model '{model}' {NO_TOKENIZER}",
    )
    _fails(
        [
            "train",
            "--print-config",
            "grpo_calc_tiny",
            f"model.path={model}",
            "data.env_kwargs.sandbox=fake",
        ],
        capsys,
        rf"model\.path '{model}' {NO_TOKENIZER}",
    )
    _fails(
        ["serve-proxy", "--model", model, "--engine", "hf", "--port", "0"],
        capsys,
        rf"--model '{model}' {NO_TOKENIZER}",
    )
    (no_tokenizer / "config.json").unlink()
    (no_tokenizer / ".metadata").write_bytes(b"")  # what a DCP checkpoint dir holds
    _fails(
        eval_args,
        capsys,
        r"no config\.json .* and no tokenizer .* a DCP training checkpoint, not a model: pass "
        r"the run's final/ directory",
    )


BUSY = r"cannot listen on 127\.0\.0\.1:{port}: the port is in use by another process; pass another --port \(0 picks a free one\)"  # noqa: E501


def test_a_busy_port_is_named_by_every_server_command(
    busy_port: int, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    busy = BUSY.format(port=busy_port)
    port = ["--port", str(busy_port)]
    _fails(["serve-sandbox", "--backend", "fake", *port], capsys, busy)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "p1", "title": "Paris", "text": "Paris is in France."}))
    index = ["--corpus", str(corpus), "--index", str(tmp_path / "index")]
    _fails(["serve-search", *index, *port], capsys, busy)
    # before the engine's load: the port is checked first
    _fails(["serve-proxy", "--model", str(tiny_model_dir), "--engine", "hf", *port], capsys, busy)


def test_a_missing_corpus_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = tmp_path / "index"
    argv = ["serve-search", "--corpus", "nope.jsonl", "--index", str(index)]
    _fails(argv, capsys, r"corpus file 'nope\.jsonl' does not exist; pass a JSONL file .* searchqa")
    assert not index.exists()  # nothing was written for it


def test_an_empty_yaml_or_one_whose_top_level_is_a_list_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listed, empty = tmp_path / "listed.yaml", tmp_path / "empty.yaml"
    listed.write_text("- model:\n    path: tiny\n")
    empty.write_text("# nothing set\n")
    _fails(
        ["train", "--print-config", str(listed)],
        capsys,
        r"listed\.yaml': its top level is a list; a config is a mapping of sections",
    )
    _fails(
        ["train", "--print-config", str(empty)],
        capsys,
        r"empty\.yaml' is empty; write the sections to change",
    )
    _fails(["sft", "--print-config", str(empty)], capsys, r"empty\.yaml' is empty")


def test_make_tiny_model_onto_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    there = tmp_path / "model"
    there.write_text("not a directory")
    _fails(["make-tiny-model", str(there)], capsys, r"'.*model' is a file; pass a new or an")
    assert there.read_text() == "not a directory"


def test_print_config_runs_the_checks_train_runs(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["train", "--print-config", "grpo_calc_tiny", "data.env_kwargs.sandbox=fake"]
    _fails(
        [*base, "data.env=agentloop/Calcc-v0"],
        capsys,
        r"no env registered as 'agentloop/Calcc-v0'\. Did you mean 'agentloop/Calc-v0'\?",
    )
    _fails([*base, "data.env_kwargs.digitz=2"], capsys, r"Did you mean 'digits'\?")
    if importlib.util.find_spec("wandb") is None:
        _fails(
            [*base, "logging.wandb=true"],
            capsys,
            r"logging\.wandb=true but the wandb package is not installed; pip install wandb",
        )
    assert main(base) == 0  # the shipped example passes them
    assert "# batch: 8 prompts × n=8 = 64 sequences per step" in capsys.readouterr().out
