"""The Search-R1 demo (``agentloop demo --recipe search_r1``): its data, search server, traces.

An LM learns to search: the questions ask for a person's birth city (one hop) or a company
founder's birth city (two hops), all named by random codes, in a generated corpus
(``envs/search_r1_traces.py``), so no answer can be known without retrieval. The demo writes the
corpus and the agentloop/SearchR1-v0 task files under ``demo.out_dir``, starts the real
``agentloop serve-search`` BM25 server on a free loopback port for the traces and the RL stage
(and stops it by PID), has a scripted expert play the env into the SFT traces, and points GRPO
at the server and the files.
The three configs ship in ``trainers/configs/tiny_search_r1/`` (``recipes/tiny_search_r1/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentloop.errors import ConfigError
from agentloop.models.demo_config import DemoConfig, DemoConfigs, DemoFamily, override
from agentloop.models.tiny import TINY_SHAPE, tiny_model_dir, tiny_model_path

__all__ = [
    "SEARCH_R1",
    "SearchR1DemoConfig",
    "make_search_r1_traces",
    "search_server",
    "world_files",
]

#: The server's start-up (Python, bm25s, building the index of a few thousand passages) on a
#: loaded 2-core machine takes ~25 s.
_START_TIMEOUT_S = 180.0
SEARCH_R1_ENV_ID = "agentloop/SearchR1-v0"
_MAX_CHARS = 300  # passages' characters a search shows (the traces and grpo.yaml's env_kwargs)


@dataclass(frozen=True)
class SearchR1DemoConfig(DemoConfig):
    """The Search-R1 demo's ``demo:`` section. World: ``num_docs`` passages of corpus seed
    ``corpus_seed``, a ``two_hop_rate`` share of the questions about a founder, ``num_test``
    held-out questions. Traces: ``num_traces`` rollout-format rows + ``num_compact`` compact
    rows of ``questions_per_compact`` episodes; ``guess_rate`` of the expert's episodes answer
    without searching, ``typo_rate`` mistype the answer; every search asks for ``topk``
    passages. ``retriever``: the search server's URL, set while the demo's own server runs
    (:func:`search_server`). ``hidden_size`` × ``num_layers``: the base model's shape."""

    family: str = "search_r1"
    out_dir: str = "runs/demo-search-r1"
    num_docs: int = 6000
    corpus_seed: int = 1
    two_hop_rate: float = 0.5
    num_test: int = 200
    num_traces: int = 200
    num_compact: int = 600
    questions_per_compact: int = 8
    guess_rate: float = 0.15
    typo_rate: float = 0.0
    topk: int = 1
    retriever: str = ""
    hidden_size: int = TINY_SHAPE[0]
    num_layers: int = TINY_SHAPE[1]

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.topk < 1:
            raise ConfigError(f"demo.topk={self.topk}: ask for at least 1 passage a search")
        if self.hidden_size < 128 or self.hidden_size % 128 or self.num_layers < 1:
            raise ConfigError(
                f"demo.hidden_size={self.hidden_size}, demo.num_layers={self.num_layers}: use a "
                "hidden_size that is a multiple of 128 (e.g. 768) and num_layers >= 1"
            )

    @property
    def data_dir(self) -> Path:
        """Where the corpus, the task files and the BM25 index go."""
        return Path(self.out_dir) / "data"

    @property
    def files(self) -> dict[str, str]:
        """The SearchR1-v0 task files (``data.env_kwargs.files``)."""
        return {split: str(self.data_dir / f"{split}.jsonl") for split in ("train", "test")}


def world_files(demo: SearchR1DemoConfig) -> dict[str, Path]:
    """Write the demo's corpus and task files under ``demo.data_dir`` (deterministic); their
    paths (``corpus``, ``train``, ``test``)."""
    from agentloop.envs.search_r1_traces import search_world, write_search_world

    world = search_world(demo.num_docs, demo.corpus_seed, demo.two_hop_rate, demo.num_test)
    return write_search_world(world, demo.data_dir)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise ConfigError(f"`agentloop serve-search` exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise ConfigError(
        f"`agentloop serve-search` did not answer {url}/health within {_START_TIMEOUT_S:.0f} s; "
        f"its log: {log}"
    )


@contextlib.contextmanager
def search_server(corpus: Path, index: Path) -> Iterator[str]:
    """Run ``agentloop serve-search`` (BM25 over ``corpus``, its index rebuilt in ``index``) as
    a subprocess on a free loopback port; yield its URL once it answers, stop it by PID after."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = index.parent / "serve-search.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "agentloop.cli", "serve-search", "--corpus", str(corpus)]
    cmd += ["--index", str(index), "--rebuild", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(url, proc, log)
        print(f"search server: {url} (pid {proc.pid}, BM25 over {corpus})", flush=True)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make_search_r1_traces(demo: SearchR1DemoConfig, path: Path) -> Path:
    """Play the scripted expert through SearchR1-v0 into ``path``, searching the server
    ``demo.retriever`` (the family's ``services`` start it and set it)."""
    from agentloop.envs.calc_traces import write_traces
    from agentloop.envs.search_r1_traces import SearchTraceConfig, make_search_traces

    traces = SearchTraceConfig(
        files=demo.files,
        retriever=demo.retriever,
        num_traces=demo.num_traces,
        num_compact=demo.num_compact,
        questions_per_compact=demo.questions_per_compact,
        guess_rate=demo.guess_rate,
        typo_rate=demo.typo_rate,
        topk=demo.topk,
        seed=demo.seed,
    )
    if not demo.retriever:
        raise ConfigError(
            "demo.retriever is empty: the traces search the demo's own server; run them inside "
            "the family's services (agentloop demo --recipe search_r1 does)"
        )
    print(
        f"playing {traces.num_episodes} scripted SearchR1-v0 episodes (search: {demo.retriever}) "
        f"into {demo.num_traces} rollout-format + {demo.num_compact} compact rows"
    )
    rows = asyncio.run(make_search_traces(traces))
    return write_traces(rows, path)


def _base_model(demo: SearchR1DemoConfig) -> Path:
    return tiny_model_dir(hidden_size=demo.hidden_size, num_layers=demo.num_layers)


def _sft_overrides(demo: SearchR1DemoConfig) -> Sequence[str]:
    shape = (demo.hidden_size, demo.num_layers)
    if shape == TINY_SHAPE:
        return ()
    path = tiny_model_path(hidden_size=shape[0], num_layers=shape[1])
    return (override("model.path", str(path)),)


def _check(configs: DemoConfigs[SearchR1DemoConfig]) -> None:
    """GRPO plays SearchR1-v0 with the traces' passages (its task files and server: set by
    :func:`_services`)."""
    data = configs.grpo.data
    if data.env != SEARCH_R1_ENV_ID:
        raise ConfigError(
            f"grpo data.env={data.env!r}: the Search-R1 demo trains {SEARCH_R1_ENV_ID}"
        )
    if data.env_kwargs.get("max_chars", _MAX_CHARS) != _MAX_CHARS:
        raise ConfigError(
            f"grpo data.env_kwargs.max_chars={data.env_kwargs['max_chars']}: the SFT traces show "
            f"{_MAX_CHARS} characters of passages a search; keep it"
        )


@contextlib.contextmanager
def _services(
    configs: DemoConfigs[SearchR1DemoConfig],
) -> Iterator[DemoConfigs[SearchR1DemoConfig]]:
    """Write the world, run its search server around the whole pipeline; yield the configs with
    the traces and GRPO pointed at the server and GRPO at the task files."""
    demo = configs.demo
    paths = world_files(demo)
    with search_server(paths["corpus"], demo.data_dir / "index") as url:
        data = configs.grpo.data
        kwargs = {**data.env_kwargs, "files": demo.files, "retriever": url}
        grpo = dataclasses.replace(configs.grpo, data=dataclasses.replace(data, env_kwargs=kwargs))
        yield dataclasses.replace(configs, demo=dataclasses.replace(demo, retriever=url), grpo=grpo)


SEARCH_R1 = DemoFamily(
    name="search_r1",
    title="tiny Search-R1 on SearchR1-v0",
    tool="search",
    settings=SearchR1DemoConfig,
    base_model=_base_model,
    make_traces=make_search_r1_traces,
    model_name="tiny-search-r1",
    sft_overrides=_sft_overrides,
    check=_check,
    services=_services,
    # the server's URL changes every run; the base model's shape is in sft's model.path already
    cache_ignored=("retriever", "hidden_size", "num_layers"),
)
