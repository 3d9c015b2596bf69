"""The `local` backend: bubblewrap namespaces + cgroups/rlimits, pooled persistent interpreters."""

from __future__ import annotations

import asyncio
import json
import os
import posixpath
import resource
import secrets
import shutil
from collections.abc import Sequence

from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes.base import ExecResult, SandboxLimits
from agentloop.sandboxes.bwrap import BWRAP_INSTALL_HINT, fs_args, sandbox_env
from agentloop.sandboxes.cgroups import CgroupRoot, detect_cgroups, reap_stale_cgroups
from agentloop.sandboxes.launcher import Launcher
from agentloop.sandboxes.pool import KernelSandbox
from agentloop.sandboxes.process import ProcessKernel, collect_process
from agentloop.sandboxes.protocol import KERNEL_SOURCE, new_key
from agentloop.sandboxes.seccomp import seccomp_filter
from agentloop.sandboxes.slots import SlotPool

__all__ = ["LocalSandbox"]

_START_TIMEOUT_S = 30.0
# One argv string holds at most MAX_ARG_STRLEN (128 KiB) bytes; longer code goes another way.
_ARGV_CODE_MAX = 100 << 10
_FIRST_FILE_FD = 10  # cold runs' files sit at fds 10, 11, … for bwrap's --file
_CODE_FD = 9  # and long bash code at fd 9
_SECCOMP_FD = 8  # the seccomp filter, for bwrap's --seccomp
_ARGS_FD = 7  # and the files' own bwrap arguments (--args): off argv, whatever their length


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _file_pieces(files: dict[str, bytes]) -> tuple[bytearray, list[tuple[int, int, int]]]:
    """One blob with every file, then their NUL-separated bwrap arguments (``--file FD PATH``
    each; bwrap makes the parent directories); the pieces of it, as (target fd, offset, size)."""
    blob, args = bytearray(), bytearray()
    pieces: list[tuple[int, int, int]] = []
    for i, (path, data) in enumerate(files.items()):
        pieces.append((_FIRST_FILE_FD + i, len(blob), len(data)))
        args += b"--file\0%d\0/sandbox/%s\0" % (_FIRST_FILE_FD + i, os.fsencode(path))
        blob += data
    if files:
        pieces.append((_ARGS_FD, len(blob), len(args)))
        blob += args
    return blob, pieces


class LocalSandbox(KernelSandbox):
    """Runs code under bubblewrap: no network, a read-only ``/usr``, private tmpfs ``/sandbox``
    (the work dir) and ``/tmp``, its own pid/ipc/uts namespaces, no capabilities, and — when the
    host is root — a fresh unprivileged host uid per sandbox, so host files readable only by root
    stay unreadable and the per-uid process limit is exact.

    Memory, process count and CPU share go to a per-sandbox cgroup nested under this process's
    own (v1 or v2); without writable cgroups, rlimits (address space, processes) are used.
    Sandboxes are started by launchers (see ``launcher.py``). ``pool_size`` kernels (sandbox +
    warm interpreter) are kept ready: a ``run`` takes one and discards it, a session keeps one;
    with none ready a run starts cold (``bwrap ... python3 -c CODE``) on one of
    ``launcher_slots`` reusable launchers, which also caps concurrent cold runs. ``python`` must
    be visible inside: under ``/usr`` or in ``ro_binds`` (host paths bound read-only at the
    same place, e.g. a virtualenv). Bash runs are always cold.
    """

    name = "local"
    languages = ("python", "bash")

    def __init__(
        self,
        *,
        limits: SandboxLimits | None = None,
        pool_size: int = 4,
        python: str = "/usr/bin/python3",
        ro_binds: Sequence[str] = (),
        bwrap: str = "bwrap",
        cgroup_parent: str | None = None,
        use_cgroups: bool = True,
        launcher_slots: int = 32,
        seccomp: bool = True,
    ) -> None:
        super().__init__(limits=limits, pool_size=pool_size)
        for path in ro_binds:
            if not isinstance(path, str) or not posixpath.isabs(path):
                raise ConfigError(f"ro_binds entries must be absolute paths, got {path!r}")
        if isinstance(launcher_slots, bool) or not isinstance(launcher_slots, int):
            raise ConfigError(f"launcher_slots must be an int >= 1, got {launcher_slots!r}")
        if launcher_slots < 1:
            raise ConfigError(f"launcher_slots must be an int >= 1, got {launcher_slots!r}")
        self.python = python
        self.ro_binds = tuple(ro_binds)
        self.bwrap = bwrap
        self._cgroup_parent = cgroup_parent
        self._use_cgroups = use_cgroups
        self._max_slots = launcher_slots
        self._cgroups: CgroupRoot | None = None
        self._bwrap_path = ""
        self._slots: SlotPool | None = None
        self._root = os.geteuid() == 0
        self.seccomp = seccomp
        self._filter = b""

    async def _prepare(self) -> None:
        found = shutil.which(self.bwrap)
        if found is None:
            raise SandboxError(BWRAP_INSTALL_HINT)
        self._bwrap_path = found
        if self.seccomp:
            self._filter = await asyncio.to_thread(seccomp_filter)
        for path in self.ro_binds:
            if not os.path.exists(path):
                raise ConfigError(f"ro_binds entry {path!r} does not exist on this host")
        real = os.path.realpath(self.python)
        visible = ("/usr/", *(p.rstrip("/") + "/" for p in self.ro_binds))
        if not os.path.isfile(real) or not real.startswith(visible):
            raise ConfigError(
                f"python={self.python!r} (-> {real}) is not an interpreter visible inside the "
                "sandbox, which sees only /usr and ro_binds; install python3 under /usr "
                "(`apt-get install python3`) or pass ro_binds=[<its install prefix>]"
            )
        if self._use_cgroups:
            self._cgroups = await asyncio.to_thread(detect_cgroups, self._cgroup_parent)
            if self._cgroups is not None:
                await asyncio.to_thread(reap_stale_cgroups, self._cgroups)
        self._slots = SlotPool(self._cgroups, self.limits, self.python, self._max_slots)
        self._slots.prewarm(2)

    async def close(self) -> None:
        await super().close()
        slots, self._slots = self._slots, None
        if slots is not None:
            await slots.close()

    @property
    def cgroup_version(self) -> int | None:
        """1 or 2 when limits use cgroups, None when they fall back to rlimits."""
        return self._cgroups.version if self._cgroups else None

    def _rlimits(self) -> dict[str, int | None]:
        lim = self.limits
        return {
            "core": 0,
            "fsize": lim.max_file_mb << 20,
            # per-uid, so exact only with our own fresh uid (root); else the pids cgroup decides
            "nproc": lim.max_processes if self._root else None,
            "as": None if self._cgroups is not None else lim.memory_mb << 20,
        }

    def _bwrap_argv(self, extra: Sequence[str] = ()) -> list[str]:
        # No --uid/--as-pid-1: both make bwrap's --die-with-parent ineffective (a credential
        # change clears the parent-death signal), and sandboxes must die with this process.
        # Inside, the code runs as the fresh host uid it was started with.
        argv = [self._bwrap_path, "--unshare-all", "--unshare-user", "--cap-drop", "ALL"]
        argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        if self.seccomp:  # no nested user namespaces; the filter refuses the rest
            argv += ["--disable-userns", "--seccomp", str(_SECCOMP_FD)]
        argv += fs_args(self.ro_binds, self.limits)
        # the root tmpfs goes read-only last: only /sandbox and /tmp stay writable
        return [*argv, *extra, "--remount-ro", "/", "--chdir", "/sandbox"]

    def _pieces(
        self, fd: int, pieces: list[tuple[int, int, int]], at: int = 0
    ) -> tuple[int, list[tuple[int, int, int]]]:
        """The launcher's ``split``: ``pieces`` of ``fd``, plus the filter (at offset ``at``)."""
        if self.seccomp:
            pieces = [*pieces, (_SECCOMP_FD, at, len(self._filter))]
        return fd, pieces

    def _uid(self) -> int | None:
        return 1_000_000 + secrets.randbelow(1 << 30) if self._root else None

    async def _spawn_kernel(self) -> ProcessKernel:
        """A kernel on a launcher slot that it holds while it lives."""
        slots = self._slots
        assert slots is not None
        key = new_key()
        rlimits = json.dumps(self._rlimits())
        command = [self.python, "-u", "-c", KERNEL_SOURCE, "isolated", rlimits]
        slot = await slots.take(bounded=False)
        fd = os.memfd_create("seccomp")
        try:
            _write_all(fd, self._filter)
            env = sandbox_env(self.limits)
            argv = self._bwrap_argv() + command
            proc = await slot.launch(argv, env, self._uid(), {}, True, split=self._pieces(fd, []))
        except BaseException:
            slots.release(slot)
            raise
        finally:
            os.close(fd)

        async def release() -> None:
            slots.release(slot)

        kernel = ProcessKernel(
            proc,
            key,
            self.limits.max_output_bytes,
            kill=proc.kill,
            cgroup=slot.cgroup,
            on_close=release,
        )
        await kernel.handshake(_START_TIMEOUT_S)  # closes the kernel if it does not start
        return kernel

    async def _cold_run(
        self, code: str, language: str, timeout_s: float, stdin: str | None, files: dict[str, bytes]
    ) -> ExecResult:
        """A run without a warm kernel: ``bwrap ... python3 -c CODE`` on a launcher slot.

        Files travel as one memfd that the launcher cuts into one fd per file (``--file``), and
        their bwrap arguments as one more piece of it (``--args``), so no number or length of
        paths within the documented limits can overflow the argv limit (``E2BIG``).
        Code too long for one argv string (``MAX_ARG_STRLEN``) runs on a kernel started for it
        (Python, which reads its code from stdin) or is sourced from an fd (bash).
        """
        big = len(code.encode()) > _ARGV_CODE_MAX
        if big and language == "python":
            return await super()._cold_run(code, language, timeout_s, stdin, files)
        blob, pieces = _file_pieces(files)
        extra = ["--args", str(_ARGS_FD)] if files else []
        if big:  # bash: the code is one more piece, sourced from its fd
            pieces.append((_CODE_FD, len(blob), len(code.encode())))
            blob += code.encode()
        fd = os.memfd_create("files")
        try:
            await asyncio.to_thread(_write_all, fd, blob + self._filter)
            split = self._pieces(fd, pieces, at=len(blob))
            for attempt in range(2):
                res = await self._cold_exec(code, language, timeout_s, stdin, split, extra)
                # bwrap itself failed (e.g. a transient EAGAIN from clone): not the code's doing
                if not (res.exit_code == 1 and res.stderr.startswith("bwrap: ") and not res.stdout):
                    return res
                await asyncio.sleep(0.05 * (attempt + 1))
            raise SandboxError(f"bubblewrap could not start the sandbox: {res.stderr.strip()}")
        finally:
            os.close(fd)

    async def _cold_exec(
        self,
        code: str,
        language: str,
        timeout_s: float,
        stdin: str | None,
        split: tuple[int, list[tuple[int, int, int]]],
        extra: list[str],
    ) -> ExecResult:
        assert self._slots is not None
        cpu = int(min(self.limits.cpu_limit_s, timeout_s)) + 1
        # CPU: SIGXCPU at the soft limit (a hard limit equal to it would SIGKILL first)
        rlimits = [(resource.RLIMIT_CPU, cpu, cpu + 1)]
        for name, value in self._rlimits().items():
            if value is not None:
                rlimits.append((getattr(resource, "RLIMIT_" + name.upper()), value, value))
        if language == "python":
            command = [self.python, "-c", code]
        elif len(code.encode()) > _ARGV_CODE_MAX:
            command = ["bash", "-c", f". /dev/fd/{_CODE_FD}"]
        else:
            command = ["bash", "-c", code]
        argv = self._bwrap_argv(extra) + command
        slot = await self._slots.take()
        try:
            return await self._run_on(slot, argv, stdin, timeout_s, split, rlimits)
        finally:
            self._slots.release(slot)

    async def _run_on(
        self,
        slot: Launcher,
        argv: list[str],
        stdin: str | None,
        timeout_s: float,
        split: tuple[int, list[tuple[int, int, int]]],
        rlimits: list[tuple[int, int, int]],
    ) -> ExecResult:
        cg = slot.cgroup
        oom_before = cg.oom_kills() if cg is not None else 0
        env = sandbox_env(self.limits)
        # the OOM killer takes the program, never the launcher in its cgroup
        proc = await slot.launch(
            argv, env, self._uid(), {}, bool(stdin), rlimits, 1000, split if split[1] else None
        )
        return await collect_process(
            proc,  # type: ignore[arg-type]  # the subset of Process it uses
            stdin=stdin,
            timeout_s=timeout_s,
            max_output_bytes=self.limits.max_output_bytes,
            kill=proc.kill,
            oom=lambda: cg is not None and cg.oom_kills() > oom_before,
        )
