"""The bubblewrap layer of the `local` backend: what the sandbox sees of the host."""

from __future__ import annotations

import os
from collections.abc import Sequence

from agentloop.sandboxes.base import SandboxLimits

__all__ = ["BWRAP_INSTALL_HINT", "fs_args", "sandbox_env"]

BWRAP_INSTALL_HINT = (
    "bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap` "
    "(Fedora: `dnf install bubblewrap`), or — only for code you trust — opt into the "
    "unisolated backend with make_sandbox('subprocess_unsafe')"
)
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives")


def sandbox_env(limits: SandboxLimits) -> dict[str, str]:
    """The whole environment of sandboxed code: nothing from the host leaks in."""
    threads = str(max(1, int(limits.cpus + 0.999)))
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/sandbox",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MPLBACKEND": "Agg",
    }


def fs_args(ro_binds: Sequence[str], limits: SandboxLimits) -> list[str]:
    """What the sandbox sees: the host's system dirs read-only, and writable tmpfs
    ``/sandbox``, ``/tmp`` and ``/dev/shm`` of ``disk_mb`` each; nothing else is writable."""
    args = ["--ro-bind", "/usr", "/usr"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):  # merged /usr: keep the symlink
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--dir", "/etc"]
    for f in _ETC_FILES:
        args += ["--ro-bind-try", f, f]
    for path in ro_binds:
        args += ["--ro-bind", path, path]
    disk = str(limits.disk_mb << 20)
    args += ["--proc", "/proc", "--dev", "/dev"]
    # /dev itself is a tmpfs of bwrap's with no size: read-only, so nothing can fill it; shared
    # memory (POSIX semaphores, multiprocessing) gets a sized tmpfs of its own
    args += ["--perms", "1777", "--size", disk, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    args += ["--perms", "1777", "--size", disk, "--tmpfs", "/tmp"]
    args += ["--perms", "0700", "--size", disk, "--tmpfs", "/sandbox"]
    return args
