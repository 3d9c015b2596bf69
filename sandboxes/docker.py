"""The `docker` backend: a container per session via the Docker Engine API (Docker or podman)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes.base import ExecResult, SandboxLimits, pid_alive
from agentloop.sandboxes.bwrap import sandbox_env
from agentloop.sandboxes.pool import KernelSandbox
from agentloop.sandboxes.protocol import (
    KERNEL_SOURCE,
    SectionBuffer,
    SectionMarks,
    StreamKernel,
    new_key,
)
from agentloop.sandboxes.seccomp import docker_profile

__all__ = [
    "DEFAULT_IMAGE",
    "LABEL",
    "DockerKernel",
    "DockerSandbox",
    "FrameSplitter",
    "reap_containers",
    "sandbox_containers",
]

#: Built locally from the host's Python by ``agentloop.sandboxes.podman.ensure_python_image``.
DEFAULT_IMAGE = "agentloop-sandbox-python:latest"
LABEL = "agentloop.sandbox"
_OWNER = "agentloop.owner"
_START_TIMEOUT_S = 60.0
_HEADER = struct.Struct(">BxxxI")
_RECV_BYTES = 1 << 16
# One argv string holds at most MAX_ARG_STRLEN (128 KiB) bytes; longer bash goes another way.
_ARGV_CODE_MAX = 100 << 10


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def reap_containers(client: Any, *, everything: bool = False) -> int:
    """Remove sandbox containers whose owning process (on this host) is gone; returns how many.

    Containers remove themselves when their client disconnects; this catches the rest (a crash
    between create and start). ``everything=True`` removes all agentloop sandbox containers.
    """
    removed = 0
    host = socket.gethostname()
    for cid, labels in sandbox_containers(client):
        name, _, pid = labels.get(_OWNER, "").rpartition(":")
        stale = name == host and pid.isdigit() and not pid_alive(int(pid))
        if everything or stale:
            with contextlib.suppress(Exception):
                client.api.remove_container(cid, force=True)
                removed += 1
    return removed


def sandbox_containers(client: Any) -> list[tuple[str, dict[str, str]]]:
    """``(id, labels)`` of every agentloop sandbox container. Uses the plain list call: the SDK's
    ``containers.list`` inspects each container afterwards and fails when one is removed in
    between (they remove themselves when their client goes away)."""
    found = client.api.containers(all=True, filters={"label": LABEL})
    return [(c["Id"], dict(c.get("Labels") or {})) for c in found]


class FrameSplitter:
    """Splits the engine's multiplexed attach stream (frames: an 8-byte header with the stream
    number and payload size, then the payload) into ``(stream, bytes)`` pieces as bytes arrive,
    holding back at most a partial header: a frame is never assembled whole."""

    def __init__(self) -> None:
        self._head = b""
        self._stream = 0
        self._left = 0  # payload bytes of the current frame still to come

    def split(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        pos = 0
        while pos < len(data):
            if self._left == 0:
                take = _HEADER.size - len(self._head)
                self._head += data[pos : pos + take]
                pos += take
                if len(self._head) == _HEADER.size:
                    self._stream, self._left = _HEADER.unpack(self._head)
                    self._head = b""
                continue
            piece = data[pos : pos + self._left]
            pos += len(piece)
            self._left -= len(piece)
            yield self._stream, piece


class DockerKernel(StreamKernel):
    """A kernel that is a container's main process, reached over its attach socket.

    The container has ``StdinOnce``: when this client disconnects (or crashes), the kernel reads
    EOF, exits, and the engine auto-removes the container. The socket is drained as fast as it
    fills, into :class:`SectionBuffer` s that keep at most ``cap`` bytes per section, so the
    host's memory stays bounded whatever the container writes, during a run or after it.
    """

    def __init__(self, client: Any, cid: str, sock: Any, key: str, cap: int) -> None:
        self._loop = asyncio.get_running_loop()
        marks = SectionMarks(key)
        stdout = SectionBuffer(marks, cap)
        stderr = SectionBuffer(marks, cap, status_line=True)
        super().__init__(stdout, stderr, cap, key)
        self.client = client
        self.id = cid
        self._io = sock
        self._raw: socket.socket = getattr(sock, "_sock", sock)
        self._raw.setblocking(False)
        self._streams = {1: stdout, 2: stderr}
        self._pump = self._loop.create_task(self._demux())
        self._closed = False

    async def _demux(self) -> None:
        """Feed each frame's bytes to its stream until the socket closes (or close() cancels)."""
        frames = FrameSplitter()
        try:
            while chunk := await self._loop.sock_recv(self._raw, _RECV_BYTES):
                for stream, piece in frames.split(chunk):
                    if (sections := self._streams.get(stream)) is not None:
                        sections.feed(piece)
        except OSError:
            pass
        finally:
            for sections in self._streams.values():
                sections.feed_eof()

    async def _send(self, data: bytes) -> None:
        await self._loop.sock_sendall(self._raw, data)

    async def kill(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.client.api.kill, self.id)

    async def exit_code(self) -> int | None:
        try:
            res = await asyncio.wait_for(asyncio.to_thread(self.client.api.wait, self.id), 5)
            return int(res.get("StatusCode"))
        except Exception:
            return None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.alive = False
        with contextlib.suppress(OSError):
            self._raw.close()  # stdin EOF: the kernel exits on its own
        self._pump.cancel()
        await self.kill()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.client.api.remove_container, self.id, force=True)


class DockerSandbox(KernelSandbox):
    """Containers through the Docker Engine API (Docker, or podman's compatible service).

    Each kernel is a container: no network, read-only root, tmpfs ``/sandbox`` and ``/tmp`` and
    a ``/dev/shm`` of ``disk_mb`` each, memory (no swap), pids and CPU limits, no capabilities,
    ``no-new-privileges``, user nobody.
    Containers carry the ``agentloop.sandbox`` label and remove themselves when this client goes
    away; :func:`reap_containers` removes what a crashed client left. ``image`` needs ``python3``
    (and ``bash`` for ``language="bash"``); build the default one with
    ``python -m agentloop.sandboxes.podman --build-image``.
    """

    name = "docker"
    languages = ("python", "bash")

    def __init__(
        self,
        *,
        limits: SandboxLimits | None = None,
        pool_size: int = 2,
        image: str = DEFAULT_IMAGE,
        base_url: str | None = None,
        client: Any = None,
        python: str = "python3",
    ) -> None:
        super().__init__(limits=limits, pool_size=pool_size)
        if not isinstance(image, str) or not image:
            raise ConfigError(f"image must be a non-empty image name, got {image!r}")
        self.image = image
        self.base_url = base_url
        self.python = python
        self.client = client
        self._seccomp = ""  # set by _prepare for this engine
        self._seccomp_file: str | None = None  # podman's: this sandbox's own, removed at close

    async def _prepare(self) -> None:
        if self.client is None:
            self.client = await asyncio.to_thread(self._connect)
        await asyncio.to_thread(self._check_image)
        await asyncio.to_thread(reap_containers, self.client)
        self._seccomp = await asyncio.to_thread(self._seccomp_option)

    def _seccomp_option(self) -> str:
        """``seccomp=<profile>`` for the engine: Docker takes the JSON itself, podman (same
        host) a path to it: a new file of this sandbox's (random name, mode 0600, made with
        ``O_EXCL``), so no other local user can plant or swap the profile; removed at close."""
        components = self.client.version().get("Components") or []
        if not any("podman" in str(c.get("Name", "")).lower() for c in components):
            return f"seccomp={docker_profile()}"
        fd, path = tempfile.mkstemp(prefix="agentloop-seccomp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(docker_profile())
        self._drop_seccomp_file()
        self._seccomp_file = path
        return f"seccomp={path}"

    def _drop_seccomp_file(self) -> None:
        path, self._seccomp_file = self._seccomp_file, None
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    async def close(self) -> None:
        await super().close()
        self._drop_seccomp_file()

    def _connect(self) -> Any:
        import docker

        where = self.base_url or os.environ.get("DOCKER_HOST") or "the default socket"
        try:
            client = (
                docker.DockerClient(base_url=self.base_url) if self.base_url else docker.from_env()
            )
            client.ping()
        except Exception as exc:
            raise SandboxError(
                f"cannot reach a Docker engine at {where}: {exc}; start Docker, or podman's "
                "service (`python -m agentloop.sandboxes.podman`), and pass base_url="
            ) from None
        return client

    def _check_image(self) -> None:
        import docker

        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise SandboxError(
                f"image {self.image!r} is not on the engine; build the default one with "
                "`python -m agentloop.sandboxes.podman --build-image` or pass image=<an image "
                "with python3>"
            ) from None

    def _create(self) -> tuple[str, Any]:
        from docker.types import Mount

        lim = self.limits
        mem = f"{lim.memory_mb}m"
        host_config = self.client.api.create_host_config(
            network_mode="none",
            mem_limit=mem,
            memswap_limit=mem,
            pids_limit=lim.max_processes,
            nano_cpus=int(lim.cpus * 1e9),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges", self._seccomp],
            read_only=True,
            shm_size=lim.disk_mb << 20,  # the engine's default (64 MB) is no limit of ours
            mounts=[
                Mount(d, "", type="tmpfs", tmpfs_size=lim.disk_mb << 20, tmpfs_mode=0o1777)
                for d in ("/sandbox", "/tmp")
            ],
            auto_remove=True,
        )
        rlimits = json.dumps({"core": 0, "fsize": lim.max_file_mb << 20})
        cid = self.client.api.create_container(
            self.image,
            [self.python, "-u", "-c", KERNEL_SOURCE, "isolated", rlimits],
            stdin_open=True,
            detach=False,  # with stdin_open: StdinOnce, so our disconnect stops the kernel
            user="65534:65534",
            working_dir="/sandbox",
            hostname="sandbox",
            environment=sandbox_env(lim),
            labels={LABEL: "1", _OWNER: _owner()},
            host_config=host_config,
        )["Id"]
        try:
            params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            sock = self.client.api.attach_socket(cid, params=params)
            self.client.api.start(cid)
        except Exception:
            with contextlib.suppress(Exception):
                self.client.api.remove_container(cid, force=True)
            raise
        return cid, sock

    async def _spawn_kernel(self) -> DockerKernel:
        key = new_key()
        made = asyncio.ensure_future(asyncio.to_thread(self._create))
        try:
            cid, sock = await asyncio.shield(made)
        except asyncio.CancelledError:
            # the thread goes on creating it (e.g. a pool refill cancelled by close()): remove
            # what it makes, or the container lives until its socket happens to be collected
            await asyncio.shield(self._discard_made(made))
            raise
        except Exception as exc:
            raise SandboxError(
                f"could not start a sandbox container from {self.image}: {exc}"
            ) from None
        kernel = DockerKernel(self.client, cid, sock, key, self.limits.max_output_bytes)
        await kernel.handshake(_START_TIMEOUT_S)  # closes the kernel if it does not start
        return kernel

    async def _discard_made(self, made: asyncio.Future[tuple[str, Any]]) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_START_TIMEOUT_S):
                cid, sock = await made
            sock.close()
            await asyncio.to_thread(self.client.api.remove_container, cid, force=True)

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        """As :meth:`KernelSandbox.run`; bash runs through the kernel as a child process."""
        if language == "bash":
            code, language = _bash_wrapper(code), "python"
        return await super().run(
            code, language=language, timeout_s=timeout_s, stdin=stdin, files=files
        )


def _bash_wrapper(script: str) -> str:
    """Python that runs ``script`` in bash; a script longer than one argv string may be
    (``MAX_ARG_STRLEN``, 128 KiB) is sourced from a memfd instead, as the local backend does."""
    if len(script.encode()) <= _ARGV_CODE_MAX:
        run = f"_rc = _sp.call(['bash', '-c', {script!r}])\n"
    else:
        run = (
            "import os as _os\n"
            "_fd = _os.memfd_create('script')\n"
            f"_left = memoryview({script!r}.encode())\n"
            "while _left:\n"
            "    _left = _left[_os.write(_fd, _left) :]\n"
            "_rc = _sp.call(['bash', '-c', '. /dev/fd/%d' % _fd], pass_fds=(_fd,))\n"
        )
    return f"import subprocess as _sp, sys as _sys\n{run}_sys.exit(128 - _rc if _rc < 0 else _rc)\n"
