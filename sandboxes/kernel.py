"""In-sandbox kernel: a supervisor that keeps a forked Python worker serving framed runs.

This file runs *inside* the sandbox (``python3 -u -c <this source> SENTINEL MODE LIMITS``) and
uses only the standard library. Protocol, over the process's own stdin/stdout/stderr:

* host -> kernel, stdin: 4-byte big-endian length + JSON ``{"seq", "code", "stdin", "files",
  "cpu_s"}`` (files are base64).
* kernel -> host: the run's output on stdout/stderr, then SENTINEL on stdout and
  SENTINEL + one JSON line (``seq``, ``exit_code``, ``oom``, ``cpu``, ``died``, ``duration``)
  on stderr. The first worker announces itself with a ``{"seq": 0, "ready": true}`` section.

The worker owns the interpreter state; if it dies (OOM killer, ``os._exit``, CPU limit) the
supervisor reports the death for the in-flight run and forks a fresh worker. After every run,
processes the code left behind are killed (``MODE=isolated``: everything in the sandbox's own pid
namespace but its init and the supervisor; ``MODE=shared``: the process group), so nothing
outlives a run.
"""

import base64
import contextlib
import json
import mmap
import os
import resource
import signal
import struct
import sys
import time
import traceback

__all__ = ["kill_strays", "main", "supervise", "worker"]

_STATE = struct.Struct("=qb")  # in-flight seq, worker saw EOF


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _apply_limits(limits):
    for name, value in limits.items():
        if value is not None:
            res = getattr(resource, "RLIMIT_" + name.upper())
            resource.setrlimit(res, (int(value), int(value)))


def _proc_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _stat(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            tail = f.read().rsplit(b")", 1)[1].split()
        return tail[0], int(tail[2])  # state, process group
    except (OSError, IndexError, ValueError):
        return b"X", -1


def _strays(mode, keep):
    """Live processes to kill: all but ``keep`` in the sandbox's own pid namespace (isolated),
    or this process group's (shared)."""
    pgid = os.getpgrp()
    out = []
    for pid in _proc_pids():
        if pid in keep:
            continue
        state, group = _stat(pid)
        if state in (b"Z", b"X"):
            continue
        if mode == "isolated" or group == pgid:
            out.append(pid)
    return out


def _reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def kill_strays(mode, keep):
    """Kill every process the run left behind, then wait (bounded) until they are gone."""
    deadline = time.monotonic() + 2.0
    while True:
        pids = _strays(mode, keep)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        time.sleep(0.001)


def _section(sentinel, info):
    _write_all(1, sentinel)
    _write_all(2, sentinel + json.dumps(info).encode() + b"\n")


def _exit_status(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(str(code) + "\n")
    return 1


def _prepare(req):
    for path, blob in (req.get("files") or {}).items():
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(blob))
    fd = os.memfd_create("stdin")
    _write_all(fd, (req.get("stdin") or "").encode())
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the run
    cpu_s = req.get("cpu_s")
    if cpu_s:
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime + cpu_s) + 1
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _is_kernel_frame(code):
    return code.co_filename != "<string>" or code.co_name != "<module>"


def _execute(req, namespace, streams):
    exit_code, oom = 0, False
    try:
        _prepare(req)
        exec(compile(req["code"], "<string>", "exec"), namespace)
    except SystemExit as exc:
        exit_code = _exit_status(exc)
    except BaseException as exc:
        oom = isinstance(exc, MemoryError)
        tb = exc.__traceback__
        while tb is not None and _is_kernel_frame(tb.tb_frame.f_code):
            tb = tb.tb_next
        lines = traceback.format_exception(type(exc), exc, tb)
        try:
            sys.stderr.write("".join(lines))
        except BaseException:
            os.write(2, "".join(lines).encode(errors="replace"))
        exit_code = 1
    for stream in (sys.stdout, sys.stderr, *streams):
        with contextlib.suppress(BaseException):
            stream.flush()
    sys.stdout, sys.stderr = streams
    return exit_code, oom


def worker(cmd_fd, sentinel, mode, state):
    """Serve runs until the host closes stdin; the interpreter state lives here."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")  # the OOM killer takes the worker, not the supervisor
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    streams = (sys.stdout, sys.stderr)
    keep = {os.getpid(), os.getppid(), 1}
    _section(sentinel, {"seq": 0, "ready": True})
    while True:
        header = _read_exact(cmd_fd, 4)
        body = header and _read_exact(cmd_fd, struct.unpack(">I", header)[0])
        if not body:
            state[:] = _STATE.pack(0, 1)
            os._exit(0)
        req = json.loads(body)
        state[:] = _STATE.pack(req["seq"], 0)
        start = time.perf_counter()
        exit_code, oom = _execute(req, namespace, streams)
        duration = time.perf_counter() - start
        kill_strays(mode, keep)
        info = {"seq": req["seq"], "exit_code": exit_code, "oom": oom, "duration": duration}
        _section(sentinel, info)
        state[:] = _STATE.pack(0, 0)


def supervise(cmd_fd, sentinel, mode):
    """Fork workers forever; report a worker's death for the run it was serving."""
    state = mmap.mmap(-1, _STATE.size)
    while True:
        state[:] = _STATE.pack(0, 0)
        pid = os.fork()
        if pid == 0:
            try:
                worker(cmd_fd, sentinel, mode, state)
            finally:
                os._exit(70)
        start = time.perf_counter()
        while True:
            dead, status = os.waitpid(-1, 0)
            if dead == pid:
                break
        seq, eof = _STATE.unpack(state[:])
        if eof:
            return
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        code = 128 + sig if sig else os.WEXITSTATUS(status)
        kill_strays(mode, {os.getpid(), 1})
        info = {
            "seq": seq,
            "exit_code": code,
            "oom": sig == signal.SIGKILL,
            "cpu": sig == signal.SIGXCPU,
            "died": True,
            "duration": time.perf_counter() - start,
        }
        _section(sentinel, info)


def main():
    sentinel = sys.argv[1].encode()
    mode = sys.argv[2]
    _apply_limits(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
    cmd_fd = os.dup(0)  # not inheritable: user code never sees the command channel
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if mode == "isolated" and os.getpid() > 2:
        # killing every other process is only safe in a private pid namespace (pid 1 or 2 there)
        sys.stderr.write("kernel: MODE=isolated needs its own pid namespace\n")
        sys.exit(2)
    if mode == "shared" and os.getpid() != os.getpgrp():
        os.setpgid(0, 0)
    supervise(cmd_fd, sentinel, mode)


if __name__ == "__main__":
    main()
