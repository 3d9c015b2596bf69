"""The bubblewrap layer of the `local` backend: the sandbox's view of the host, start-up helpers."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

from .base import SandboxLimits

__all__ = ["BOOT_MOUNT", "BWRAP_INSTALL_HINT", "fs_args", "sandbox_env", "write_boot_dir"]

BWRAP_INSTALL_HINT = (
    "bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap` "
    "(Fedora: `dnf install bubblewrap`), or — only for code you trust — opt into the "
    "unisolated backend with make_sandbox('subprocess_unsafe')"
)
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives")
BOOT_MOUNT = "/.agentloop"
# Start-up of cold Python runs (imported by site before the program, via PYTHONPATH): set the
# rlimits. The variable is unset, so the program's own child interpreters skip it.
_SITECUSTOMIZE = """\
import os


def _agentloop_boot():
    try:  # the OOM killer takes the program, never the launcher in its cgroup
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    limits = os.environ.pop("AGENTLOOP_RLIMITS", "")
    if limits:
        import resource

        for item in limits.split(","):
            name, value = item.split("=")
            rlim = getattr(resource, "RLIMIT_" + name.upper())
            # CPU: SIGXCPU at the soft limit; a hard limit equal to it would SIGKILL first
            hard = int(value) + (name == "cpu")
            resource.setrlimit(rlim, (int(value), hard))


_agentloop_boot()
del _agentloop_boot, os
"""


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
    args += ["--perms", "1777", "--size", disk, "--tmpfs", "/tmp"]
    args += ["--perms", "0700", "--size", disk, "--tmpfs", "/sandbox"]
    return args


def write_boot_dir(python: str) -> str:
    """A world-readable dir with the start-up ``sitecustomize.py`` (removed by ``close``),
    byte-compiled by ``python`` (compiling it at every start-up costs ~2 ms)."""
    for stale in glob.glob(os.path.join(tempfile.gettempdir(), "agentloop-boot-*")):
        pid = os.path.basename(stale).split("-")[2]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(stale, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"agentloop-boot-{os.getpid()}-")
    os.chmod(path, 0o755)
    with open(os.path.join(path, "sitecustomize.py"), "w") as f:
        f.write(_SITECUSTOMIZE)
    compile_it = (
        "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True, "
        "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)"
    )
    src = os.path.join(path, "sitecustomize.py")
    subprocess.run([python, "-c", compile_it, src], check=False, capture_output=True)
    for root, dirs, files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return path
