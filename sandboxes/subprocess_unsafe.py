"""The `subprocess_unsafe` backend: plain child processes, rlimits only, NO isolation (opt-in)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import warnings

from agentloop.errors import ConfigError
from agentloop.sandboxes.base import ExecResult, SandboxLimits
from agentloop.sandboxes.pool import KernelSandbox
from agentloop.sandboxes.process import ProcessKernel, collect_process
from agentloop.sandboxes.protocol import KERNEL_SOURCE, new_key

__all__ = ["UnsafeSubprocessSandbox"]

_START_TIMEOUT_S = 30.0


class UnsafeSubprocessSandbox(KernelSandbox):
    """Runs code as an ordinary child process of this one: **no isolation at all**.

    The code can read and write every file this process can, use the network and signal its
    processes; only rlimits (address space, CPU time, file size) and the wall clock apply, and
    leftover processes are killed by process group. Use it only for code you trust, on machines
    without bubblewrap. ``acknowledge_unsafe=True`` is required so nobody gets it by accident.
    Each kernel (and each cold run) gets its own temporary work dir.
    """

    name = "subprocess_unsafe"
    languages = ("python", "bash")

    def __init__(
        self,
        *,
        acknowledge_unsafe: bool = False,
        limits: SandboxLimits | None = None,
        pool_size: int = 2,
        python: str = sys.executable,
    ) -> None:
        if acknowledge_unsafe is not True:
            raise ConfigError(
                "the subprocess_unsafe backend runs code WITHOUT isolation; pass "
                "acknowledge_unsafe=True if the code is trusted, else install bubblewrap "
                "(`apt-get install bubblewrap`) and use make_sandbox('local')"
            )
        super().__init__(limits=limits, pool_size=pool_size)
        self.python = python
        warnings.warn(
            "subprocess_unsafe sandbox: code runs unisolated with this process's permissions",
            RuntimeWarning,
            stacklevel=2,
        )

    def _rlimits(self) -> dict[str, int]:
        lim = self.limits
        return {"core": 0, "fsize": lim.max_file_mb << 20, "as": lim.memory_mb << 20}

    def _env(self, workdir: str) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    async def _spawn_kernel(self) -> ProcessKernel:
        workdir = tempfile.mkdtemp(prefix="agentloop-unsafe-")
        key = new_key()
        argv = [self.python, "-u", "-c", KERNEL_SOURCE, "shared"]
        pipe = asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(
            *argv,
            json.dumps(self._rlimits()),
            stdin=pipe,
            stdout=pipe,
            stderr=pipe,
            cwd=workdir,
            env=self._env(workdir),
            start_new_session=True,
        )

        def kill() -> None:
            if proc.returncode is None:  # the group is ours while its leader is unreaped
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

        async def remove_workdir() -> None:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

        kernel = ProcessKernel(
            proc, key, self.limits.max_output_bytes, kill=kill, on_close=remove_workdir
        )
        await kernel.handshake(_START_TIMEOUT_S)  # closes the kernel if it does not start
        return kernel

    async def _cold_run(
        self, code: str, language: str, timeout_s: float, stdin: str | None, files: dict[str, bytes]
    ) -> ExecResult:
        with tempfile.TemporaryDirectory(prefix="agentloop-unsafe-") as workdir:
            for path, blob in files.items():
                target = os.path.join(workdir, path)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(blob)
            limits = {**self._rlimits(), "cpu": int(min(self.limits.cpu_limit_s, timeout_s)) + 1}
            prlimit = ["prlimit", *(f"--{k}={v}" for k, v in limits.items()), "--"]
            interp = [self.python, "-c", code] if language == "python" else ["bash", "-c", code]
            pipe = asyncio.subprocess.PIPE
            proc = await asyncio.create_subprocess_exec(
                *prlimit,
                *interp,
                stdin=pipe if stdin else asyncio.subprocess.DEVNULL,
                stdout=pipe,
                stderr=pipe,
                cwd=workdir,
                env=self._env(workdir),
                start_new_session=True,
            )

            def kill() -> None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

            try:
                return await collect_process(
                    proc,
                    stdin=stdin,
                    timeout_s=timeout_s,
                    max_output_bytes=self.limits.max_output_bytes,
                    kill=kill,
                )
            finally:
                kill()  # background processes of the run die with it
