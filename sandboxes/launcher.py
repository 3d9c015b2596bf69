"""Launchers: tiny subreaper processes, each in a sandbox's cgroup, that fork bwrap and reap it.

Every local sandbox is started by a launcher, for three reasons. (1) A process forked by one
inside a cgroup is born there: no per-sandbox cgroup attach (slow on cgroup v1, an RCU grace
period per controller) and no window where sandboxed code runs unlimited. (2) Forking a ~8 MB
launcher is cheaper than forking this process. (3) bwrap's outer process exits before its
in-sandbox init is reaped; the orphan goes to whatever reaps for the host, and where pid 1 never
reaps (some container and VM inits), every run would leak a zombie. A launcher is a child
subreaper and reaps the whole subtree before it reports the exit status.

A launcher runs one sandbox at a time; ``slots.SlotPool`` reuses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Mapping, Sequence

import psutil

from agentloop.errors import SandboxError
from agentloop.sandboxes.base import SandboxLimits
from agentloop.sandboxes.cgroups import Cgroup, CgroupRoot

__all__ = ["LaunchedProcess", "Launcher", "drop_launcher", "launcher_limits", "start_launcher"]

log = logging.getLogger(__name__)
_MSG = struct.Struct("=qq")  # (kind, value): kind 0 = started (pid; pidfd attached), 1 = exited
# `python3 -S -c LAUNCHER_SOURCE FD`, FD = the request socket. A request is a header (JSON
# length, fd count; the fds ride along as SCM_RIGHTS) and then the JSON (argv, env, uid,
# rlimits, OOM score, target fds, and `split`: files cut out of one memfd, each placed at its
# own target fd), any size. For each it forks; the child places the fds, sets the OOM score and
# the rlimits it was given, drops to the uid and execs; the launcher sends the pid and a pidfd,
# waits, sends the status and reaps every orphan bwrap leaves. Limits set before exec hold for
# bwrap and everything the sandboxed program starts.
LAUNCHER_SOURCE = r"""
import ctypes, fcntl, json, os, resource, signal, socket, struct, sys, time
libc = ctypes.CDLL(None)
libc.prctl(1, 9)  # PR_SET_PDEATHSIG: SIGKILL when the host process dies
libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of the sandbox come to us, to be reaped
if os.getppid() == 1:
    os._exit(0)
sock = socket.socket(fileno=int(sys.argv[1]))

def child(req, fds):
    split = req["split"]
    targets = req["targets"] + [t for t, _, _ in split]
    top = max(targets) + 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * top + len(fds) + 64:
        want = 2 * top + len(fds) + 64
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard < 0 else min(want, hard), hard))
    staged = [fcntl.fcntl(fd, fcntl.F_DUPFD, top) for fd in fds]
    for fd, target in zip(staged, req["targets"]):
        os.dup2(fd, target)
    for target, offset, size in split:  # the blob is the last fd received
        part = os.memfd_create("file", 0)  # not close-on-exec: it may stay at its number
        data = os.pread(staged[-1], size, offset)
        while data:
            data = data[os.write(part, data):]
        os.lseek(part, 0, os.SEEK_SET)
        if part != target:  # it may have been given that very (free) number
            os.dup2(part, target)
            os.close(part)
    keep = set(targets)
    for fd in range(top):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    os.closerange(top, 1 << 20)
    if req["oom_score_adj"] is not None:
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(req["oom_score_adj"]))
        except OSError:
            pass
    for rlim, soft, hard in req["rlimits"]:
        resource.setrlimit(rlim, (soft, hard))
    uid = req["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.execve(req["argv"][0], req["argv"], req["env"])

def reap_all():
    deadline = time.monotonic() + 2.0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                for name in os.listdir("/proc/self/task"):
                    with open("/proc/self/task/%s/children" % name) as f:
                        for left in f.read().split():
                            os.kill(int(left), signal.SIGKILL)
            time.sleep(0.001)

def read_exact(n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            os._exit(0)
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)

while True:
    try:
        head, fds, _flags, _addr = socket.recv_fds(sock, 16, 16)
    except OSError:
        os._exit(0)
    if len(head) < 16:
        os._exit(0)
    req = json.loads(read_exact(struct.unpack("=qq", head)[0]))
    pid = os.fork()
    if pid == 0:
        try:
            child(req, fds)
        finally:
            os._exit(127)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    socket.send_fds(sock, [struct.pack("=qq", 0, pid)], [pidfd])
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    sock.sendall(struct.pack("=qq", 1, status))
    reap_all()  # before the next request: bwrap's init, orphaned by its exit, comes to us
"""


class LaunchedProcess:
    """A sandbox started by a launcher: the part of ``asyncio.subprocess.Process`` we use."""

    def __init__(
        self,
        launcher: Launcher,
        pid: int,
        pidfd: int,
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._launcher = launcher
        self._pidfd = pidfd

    async def wait(self) -> int:
        if self.returncode is None:
            status = await self._launcher._read(1)
            self.returncode = os.waitstatus_to_exitcode(status)
            self._launcher.running = False
            self._close_pidfd()
        return self.returncode

    def kill(self) -> None:
        """Kill the sandbox: bwrap (its init follows, and the namespace with it) and, with a
        cgroup, everything in it but the launcher."""
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        if self._launcher.cgroup is not None:
            self._launcher.cgroup.kill_all(exclude={self._launcher.pid})

    def _close_pidfd(self) -> None:
        fd, self._pidfd = self._pidfd, -1
        if fd >= 0:
            os.close(fd)


class Launcher:
    """A launcher process (in ``cgroup`` when there is one) and the socket to drive it."""

    def __init__(
        self, proc: subprocess.Popen[bytes], sock: socket.socket, cg: Cgroup | None
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.cgroup = cg
        self._sock = sock
        self.running = False  # a sandbox was started and its exit not yet read

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @classmethod
    async def start(cls, python: str, cg: Cgroup | None) -> Launcher:
        # A plain Popen, not asyncio's subprocess transport: the transport finishes starting in
        # a task of its own, and when asyncio.run cancels every task at once (a run failing
        # while launchers are still starting), that task is cancelled with ours and the
        # process's exit is never delivered, so the shutdown hangs forever. Popen forks in this
        # thread as the transport does, and the exit is awaited on a pidfd (``_wait_exit``).
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [python, "-S", "-c", LAUNCHER_SOURCE, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env={},
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        if cg is not None:
            try:
                await asyncio.to_thread(cg.attach, proc.pid)  # once, before it forks anything
            except BaseException:
                proc.kill()
                await _wait_exit(proc)
                ours.close()
                raise
        return cls(proc, ours, cg)

    async def _read(self, kind: int) -> int:
        loop = asyncio.get_running_loop()
        data = b""
        while len(data) < _MSG.size:
            chunk = await loop.sock_recv(self._sock, _MSG.size - len(data))
            if not chunk:
                raise SandboxError("the sandbox launcher died")
            data += chunk
        got: int
        value: int
        got, value = _MSG.unpack(data)
        if got != kind:
            raise SandboxError("the sandbox launcher is out of sync")
        return value

    async def _read_started(self) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        while True:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(self._sock, _MSG.size, 1)
                break
            except BlockingIOError:
                ready: asyncio.Future[None] = loop.create_future()
                loop.add_reader(self._sock, _wake, ready)
                try:
                    await ready
                finally:
                    loop.remove_reader(self._sock)
        if len(msg) != _MSG.size or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise SandboxError("the sandbox launcher died while starting a sandbox")
        return _MSG.unpack(msg)[1], fds[0]

    async def launch(
        self,
        argv: list[str],
        env: Mapping[str, str],
        uid: int | None,
        fds: Mapping[int, int],
        stdin: bool,
        rlimits: Sequence[tuple[int, int, int]] = (),
        oom_score_adj: int | None = None,
        split: tuple[int, Sequence[tuple[int, int, int]]] | None = None,
    ) -> LaunchedProcess:
        """Start ``argv`` with ``fds`` ({target fd: our fd}), piped stdio, ``rlimits``
        ((``resource.RLIMIT_*``, soft, hard) each) and ``oom_score_adj`` as uid ``uid``.
        ``split`` is (a memfd, [(target fd, offset, size), …]): each piece of the memfd
        becomes a file of its own at its target fd (any number of files, one fd sent)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), -1)
        send = {0: in_r, 1: out_w, 2: err_w, **fds}
        req = {
            "argv": argv,
            "env": dict(env),
            "uid": uid,
            "targets": list(send),
            "rlimits": [list(r) for r in rlimits],
            "oom_score_adj": oom_score_adj,
            "split": [list(piece) for piece in split[1]] if split else [],
        }
        passed = [*send.values(), *([split[0]] if split else [])]
        if self.running:
            raise SandboxError("this launcher is still running a sandbox")
        self.running = True
        try:
            data = json.dumps(req).encode()
            # an idle launcher's socket is empty: the 16-byte header fits; the JSON may not
            socket.send_fds(self._sock, [_MSG.pack(len(data), len(passed))], passed)
            await asyncio.get_running_loop().sock_sendall(self._sock, data)
            pid, pidfd = await self._read_started()
        except BaseException:
            for fd in (out_r, err_r, in_w):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        stdout, stderr = await _reader(out_r), await _reader(err_r)
        writer = await _writer(in_w) if stdin else None
        return LaunchedProcess(self, pid, pidfd, writer, stdout, stderr)

    async def close(self) -> None:
        """Kill the launcher and every process below it. Without a cgroup nothing else finds
        those: a bwrap init whose outer bwrap was killed before ``--die-with-parent`` took hold
        (a window that a busy core widens) comes to the launcher, a subreaper, and would go on
        to pid 1 and outlive everything if the launcher died first."""
        await _kill_descendants(self.pid)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await _wait_exit(self.proc)
        self._sock.close()


async def _wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """``proc``'s exit status, awaited on its pidfd (no thread, no child watcher)."""
    if proc.poll() is not None:
        return proc.returncode
    loop = asyncio.get_running_loop()
    pidfd = os.pidfd_open(proc.pid)
    exited: asyncio.Future[None] = loop.create_future()
    loop.add_reader(pidfd, _wake, exited)
    try:
        await exited
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return proc.wait()


async def _kill_descendants(pid: int, deadline_s: float = 5.0) -> None:
    """SIGKILL every live process below ``pid`` until none is left: a process orphaned while
    this runs comes to ``pid`` (a subreaper) and is killed on the next pass."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            below = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        live = [p for p in below if _alive(p)]
        if not live:
            return
        for proc in live:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        await asyncio.sleep(0.01)  # the kills land; then look again
    log.warning("processes below sandbox launcher %d outlived %.0f s of SIGKILL", pid, deadline_s)


def _alive(proc: psutil.Process) -> bool:
    try:
        status: str = proc.status()
        zombie: str = psutil.STATUS_ZOMBIE
        return status != zombie
    except psutil.NoSuchProcess:
        return False


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _reader(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader


async def _writer(fd: int) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", buffering=0)
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)


def launcher_limits(limits: SandboxLimits) -> SandboxLimits:
    """A sandbox's limits plus room for its launcher (one process, a few MB)."""
    return dataclasses.replace(
        limits, memory_mb=limits.memory_mb + 16, max_processes=limits.max_processes + 1
    )


async def start_launcher(root: CgroupRoot | None, limits: SandboxLimits, python: str) -> Launcher:
    """A launcher in a fresh cgroup for ``limits`` (none without ``root``)."""
    cg = await asyncio.to_thread(root.new, launcher_limits(limits)) if root else None
    try:
        return await Launcher.start(python, cg)
    except BaseException:
        if cg is not None:
            await asyncio.to_thread(cg.remove)
        raise


async def drop_launcher(slot: Launcher) -> None:
    """Stop a launcher and remove its cgroup."""
    await slot.close()
    if slot.cgroup is not None:
        await asyncio.to_thread(slot.cgroup.remove)
