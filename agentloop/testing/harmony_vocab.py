"""The o200k_base vocabulary ``openai_harmony`` loads, rebuilt from the npm package js-tiktoken.

``openai_harmony`` (the reference harmony parser for gpt-oss) loads ``o200k_base.tiktoken`` from
``$TIKTOKEN_ENCODINGS_BASE`` and checks its sha256; it would otherwise download it from a host
this project's machines cannot reach. The npm registry ships the same ranks in js-tiktoken
(MIT), so this rebuilds the file from there once (``npm pack``), checks the very hash harmony
checks, and caches it. Run ``python -m agentloop.testing.harmony_vocab`` (``make setup`` does).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

__all__ = ["O200K_SHA256", "harmony_vocab_dir"]

JS_TIKTOKEN = "js-tiktoken@1.0.21"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
_FILE = "o200k_base.tiktoken"
_DEFAULT_DIR = Path("~/.cache/agentloop/tiktoken")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rebuild(ranks_js: str) -> str:
    """js-tiktoken's compact ranks (lines of ``<first> <offset> <b64 token>...``) as the
    ``.tiktoken`` text: one ``<b64 token> <rank>`` line per token, in rank order."""
    data = json.loads(ranks_js[ranks_js.index("{") : ranks_js.rindex("}") + 1])
    ranks: dict[int, str] = {}
    for line in data["bpe_ranks"].split("\n"):
        if line:
            _, offset, *tokens = line.split(" ")
            ranks.update((int(offset) + i, token) for i, token in enumerate(tokens))
    return "".join(f"{ranks[r]} {r}\n" for r in sorted(ranks))


def harmony_vocab_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """A directory holding ``o200k_base.tiktoken`` with harmony's hash, built once: the value
    for ``TIKTOKEN_ENCODINGS_BASE``."""
    target = Path(cache_dir or _DEFAULT_DIR).expanduser()
    if (target / _FILE).is_file() and _sha256(target / _FILE) == O200K_SHA256:
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"building {_FILE} needs npm (the nodejs package) on PATH")
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        subprocess.run(
            [npm, "pack", JS_TIKTOKEN, "--pack-destination", tmp, "--silent"],
            check=True,
            timeout=300,
            capture_output=True,
        )
        (tarball,) = Path(tmp).glob("js-tiktoken-*.tgz")
        with tarfile.open(tarball) as tar:
            member = tar.extractfile("package/dist/ranks/o200k_base.js")
            assert member is not None, f"{tarball.name} has no dist/ranks/o200k_base.js"
            text = _rebuild(member.read().decode())
        built = Path(tmp) / _FILE
        built.write_text(text)
        if _sha256(built) != O200K_SHA256:
            raise RuntimeError(
                f"{_FILE} rebuilt from {JS_TIKTOKEN} has sha256 {_sha256(built)}, not "
                f"{O200K_SHA256} (the hash openai_harmony checks); pin another js-tiktoken"
            )
        os.replace(built, target / _FILE)  # atomic: concurrent builders are safe
    return target


if __name__ == "__main__":
    print(harmony_vocab_dir() / _FILE)
