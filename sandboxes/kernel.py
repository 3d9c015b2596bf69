"""In-sandbox kernel: a supervisor that ends each run from outside the worker running the code.

This file runs *inside* the sandbox (``python3 -u -c <this source> MODE LIMITS``) and uses only
the standard library. Protocol, over the process's own stdin/stdout/stderr:

* host -> kernel, stdin: first the 32-character section key, then per run a 20-byte header
  (big-endian length, seq, CPU seconds or 0) + JSON ``{"code", "stdin", "files"}`` (files
  are base64).
* kernel -> host: the run's output on stdout/stderr; each section ends with MARK(n) on stdout
  and MARK(n) + one JSON line (``seq``, ``exit_code``, ``oom``, ``cpu``, ``died``,
  ``duration``) on stderr, where MARK(n) is derived from the key and the section's number
  (0: the first worker's ``{"seq": 0, "ready": true}``).

Two processes, so that the code cannot end its run on its own terms. The *supervisor* holds the
key and writes every mark; it is not dumpable, so code of the same uid can neither read its
memory nor open its file descriptors. The *worker* runs the code and keeps the session's state;
it never saw the key: the first is forked before the supervisor reads it (one interpreter start
per kernel, not two), a replacement is exec'd. It tells the supervisor a run is done over a
private pipe. The supervisor then stops the worker (SIGSTOP: none of its threads
runs between runs), kills every other process the run left (``MODE=isolated``: everything in
the sandbox's own pid namespace but its init, the supervisor and the worker; ``MODE=shared``:
the process group), and only then writes the marks. So code can end its own run early (as it
could by returning), but cannot forge the end of a run, keep running after it, or leave
processes behind; the host's deadline kills the whole sandbox from outside. The run's CPU time
(the worker's and every process it started) is counted by the supervisor too, which kills the
worker at the limit: code can lift its own ``RLIMIT_CPU``, not that. If the worker dies (OOM
killer, ``os._exit``, CPU limit) the supervisor reports the death for the in-flight run and
starts a fresh worker.
"""

import base64
import contextlib
import hashlib
import hmac
import json
import os
import resource
import select
import signal
import struct
import sys
import time

__all__ = ["kill_strays", "main", "mark", "worker"]

KEY_LEN = 32
_HEADER = struct.Struct(">Iqd")  # body length, seq, CPU seconds (0: no limit)
_MAX_DONE = 1 << 12  # the worker's done line
_CPU_POLL_S = 0.1  # how often the supervisor counts a run's CPU time
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")  # the unit of CPU time in /proc/PID/stat


def mark(key, n):
    """The mark that ends section ``n``: unforgeable without ``key`` (hex text)."""
    digest = hmac.new(key.encode(), str(n).encode(), hashlib.sha256).hexdigest()
    return ("\x1eagentloop-" + digest[:24] + "\x1e").encode()


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
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


def _stat(pid):
    """State, process group and CPU clock ticks (its own and its reaped children's)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            tail = f.read().rsplit(b")", 1)[1].split()
        return tail[0], int(tail[2]), sum(int(t) for t in tail[11:15])
    except (OSError, IndexError, ValueError):
        return b"X", -1, 0


def _run_ticks(mode):
    """CPU clock ticks of every process a run may have made, unreaped dead ones included: all
    but init and the supervisor in the sandbox's pid namespace (isolated), or the process
    group's (shared). A child reaped by another of them adds its ticks to its parent's."""
    keep, pgid, total = (1, os.getpid()), os.getpgrp(), 0
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        _, group, ticks = _stat(pid)
        if pid not in keep and (mode == "isolated" or group == pgid):
            total += ticks
    return total


def _strays(mode, keep):
    """Live processes to kill: all but ``keep`` in the sandbox's own pid namespace (isolated),
    or this process group's (shared)."""
    pgid = os.getpgrp()
    out = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid in keep:
            continue
        state, group, _ = _stat(pid)
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
    """Kill every process the run left behind, then wait (bounded) until they are gone (their
    zombies are reaped by their parents: the worker at its next run, or the sandbox's init)."""
    deadline = time.monotonic() + 2.0
    while True:
        pids = _strays(mode, keep)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)


def _stopped(pid):
    """Whether every thread of ``pid`` is stopped (or the process is gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    return all(_stat(f"{pid}/task/{t}")[0] in (b"T", b"t", b"Z", b"X") for t in tasks)


def _stop(pid):
    deadline = time.monotonic() + 2.0
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGSTOP)
    while not _stopped(pid) and time.monotonic() < deadline:
        time.sleep(0.0005)


# ---- the worker: runs the code, owns the interpreter state -------------------------------


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
        import traceback  # here: every kernel start would pay ~4 ms for it

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


def worker(cmd_fd, done_fd):
    """Serve runs until the supervisor closes the command pipe; the interpreter state lives
    here. Each run's end is one JSON line on ``done_fd``."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")  # the OOM killer takes the worker, not the supervisor
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    streams = (sys.stdout, sys.stderr)
    _write_all(done_fd, b'{"ready": true}\n')
    while True:
        header = _read_exact(cmd_fd, _HEADER.size)
        body = header and _read_exact(cmd_fd, _HEADER.unpack(header)[0])
        if not body:
            os._exit(0)
        _reap()  # what the last run left was killed by the supervisor: its zombies go
        start = time.perf_counter()
        exit_code, oom = _execute(json.loads(body), namespace, streams)
        info = {"exit_code": exit_code, "oom": oom, "duration": time.perf_counter() - start}
        _write_all(done_fd, json.dumps(info).encode() + b"\n")


# ---- the supervisor: holds the key, ends runs, reports -----------------------------------


class _OverCpu(Exception):
    """The run used its CPU time."""


class _Worker:
    """A worker process and the supervisor's ends of its pipes: a fresh interpreter, or, with
    ``forked`` (only before the supervisor has the key), this one forked."""

    def __init__(self, source, mode, forked=False):
        cmd_r, self.cmd_w = os.pipe()
        self.done_r, done_w = os.pipe()
        os.set_inheritable(cmd_r, True)
        os.set_inheritable(done_w, True)
        argv = [sys.executable, "-u", "-c", source, "worker", str(cmd_r), str(done_w)]
        self.pid = os.fork()
        if self.pid == 0:
            try:
                if forked:  # it keeps its pipes and stdio, not the host's channel
                    keep = {0, 1, 2, cmd_r, done_w}
                    for fd in {int(f) for f in os.listdir("/proc/self/fd")} - keep:
                        with contextlib.suppress(OSError):
                            os.close(fd)
                    worker(cmd_r, done_w)
                os.execv(sys.executable, argv)
            finally:
                os._exit(70)
        os.close(cmd_r)
        os.close(done_w)
        self.pidfd = os.pidfd_open(self.pid)
        self.started = time.perf_counter()

    def wait_done(self, mode=None, budget=None):
        """The worker's done line as a dict, or None if it died (or sent nonsense); raises
        _OverCpu once the run's processes have used ``budget`` (:func:`_run_ticks`): counted
        from outside the code, which can lift its own RLIMIT_CPU."""
        line = b""
        while True:
            poll = _CPU_POLL_S if budget is not None else None
            ready, _, _ = select.select([self.done_r, self.pidfd], [], [], poll)
            if not ready:
                if _run_ticks(mode) > budget:
                    raise _OverCpu
                continue
            if self.done_r not in ready:
                return None
            chunk = os.read(self.done_r, _MAX_DONE)
            if not chunk:
                return None
            line += chunk
            if b"\n" in line or len(line) > _MAX_DONE:
                break
        try:
            info = json.loads(line.partition(b"\n")[0])
        except ValueError:
            info = None
        return info if isinstance(info, dict) else None

    def status(self):
        """Kill (if still alive) and reap the worker; its shell-style status."""
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        for fd in (self.cmd_w, self.done_r, self.pidfd):
            os.close(fd)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        return sig, 128 + sig if sig else os.WEXITSTATUS(status)


class _Supervisor:
    def __init__(self, cmd_fd, key, mode, source, first):
        self.cmd_fd, self.key, self.mode, self.source = cmd_fd, key, mode, source
        self.sections = 0
        self.first = first

    def end_section(self, worker, info):
        """Stop the worker, kill every other process, then write the marks of ``info``."""
        keep = {1, os.getpid()}
        if worker is not None:
            keep.add(worker.pid)
            _stop(worker.pid)
        kill_strays(self.mode, keep)
        if worker is not None:
            _stop(worker.pid)  # a stray may have sent it SIGCONT before it died
        m = mark(self.key, self.sections)
        self.sections += 1
        _write_all(1, m)
        _write_all(2, m + json.dumps(info).encode() + b"\n")

    def died(self, worker, seq, over_cpu=False):
        sig, code = worker.status()
        cpu = over_cpu or sig == signal.SIGXCPU
        info = {"seq": seq, "exit_code": code, "oom": sig == signal.SIGKILL and not cpu}
        info.update(cpu=cpu, died=True)
        info["duration"] = time.perf_counter() - worker.started
        self.end_section(None, info)

    def serve(self):
        """Start workers forever; run the host's requests on them; return at the host's EOF."""
        while True:
            worker, self.first = self.first or _Worker(self.source, self.mode), None
            if worker.wait_done() is None:
                self.died(worker, 0)
                continue
            self.end_section(worker, {"seq": 0, "ready": True})
            if not self.serve_worker(worker):
                worker.status()
                kill_strays(self.mode, {1, os.getpid()})
                return

    def serve_worker(self, worker):
        """Runs on ``worker`` until it dies (True) or the host hangs up (False)."""
        while True:
            ready, _, _ = select.select([self.cmd_fd, worker.pidfd], [], [])
            if self.cmd_fd not in ready:
                self.died(worker, 0)  # between runs
                return True
            header = _read_exact(self.cmd_fd, _HEADER.size)
            body = header and _read_exact(self.cmd_fd, _HEADER.unpack(header)[0])
            if not body:
                return False
            _, seq, cpu_s = _HEADER.unpack(header)
            worker.started = time.perf_counter()
            budget = _run_ticks(self.mode) + cpu_s * _TICKS_PER_S if cpu_s > 0 else None
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGCONT)
            try:
                _write_all(worker.cmd_w, header + body)
                info = worker.wait_done(self.mode, budget)
            except OSError:  # the worker died while reading its request
                info = None
            except _OverCpu:
                self.died(worker, seq, over_cpu=True)
                return True
            if info is None:
                self.died(worker, seq)
                return True
            result = {"seq": seq, "exit_code": info.get("exit_code"), "oom": info.get("oom")}
            result["duration"] = info.get("duration")
            if not isinstance(result["exit_code"], int):
                result["exit_code"] = 1
            self.end_section(worker, result)


def _undumpable():
    """Same-uid code may not read this process's memory or open its fds through /proc."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def main():
    if sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]))
        return
    mode = sys.argv[1]
    with open("/proc/self/cmdline", "rb") as f:
        source = f.read().split(b"\0")[3].decode()  # python3 -u -c SOURCE ...
    _apply_limits(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
    cmd_fd = os.dup(0)  # not inheritable: an exec'd worker never sees the host's channel
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if mode == "isolated" and os.getpid() > 2:
        # killing every other process is only safe in a private pid namespace (pid 1 or 2 there)
        sys.stderr.write("kernel: MODE=isolated needs its own pid namespace\n")
        sys.exit(2)
    if mode == "shared" and os.getpid() != os.getpgrp():
        os.setpgid(0, 0)
    first = _Worker(source, mode, forked=True)  # before the key; dumpable, as an exec'd one
    _undumpable()
    key = _read_exact(cmd_fd, KEY_LEN)
    if key is not None:  # else the worker, too, ends at its pipe's EOF
        _Supervisor(cmd_fd, key.decode("ascii"), mode, source, first).serve()


if __name__ == "__main__":
    main()
