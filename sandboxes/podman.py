"""Local Docker-API engine for the `docker` backend: podman's service, and an offline Python image.

``python -m agentloop.sandboxes.podman --build-image`` starts ``podman system service`` on a
private socket (containers.conf: runc, no default ulimits), builds the default image from the
host's own ``/usr/bin/python3`` when it is missing (no registry needed), prints the socket URL and
stops the service again. Tests and benchmarks use :class:`PodmanService` the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from agentloop.errors import SandboxError
from agentloop.sandboxes.docker import DEFAULT_IMAGE

__all__ = [
    "CONTAINERS_CONF",
    "PodmanService",
    "build_python_image",
    "ensure_python_image",
    "main",
    "podman_missing",
]

CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'
_INSTALL = "apt-get install podman runc"
_ETC = {
    "etc/passwd": b"root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/sandbox:/bin/sh\n",
    "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
}


def podman_missing() -> str | None:
    """Why no podman engine can be started here (None if it can)."""
    # Debian puts runc in /usr/sbin, which a non-login PATH may lack; podman looks there itself
    path = os.pathsep.join((os.environ.get("PATH", ""), "/usr/sbin", "/sbin"))
    for tool in ("podman", "runc"):
        if shutil.which(tool, path=path) is None:
            return f"{tool} is not installed (`{_INSTALL}`)"
    if os.geteuid() != 0:
        return "podman's service is started here as root only (rootless needs more setup)"
    return None


class PodmanService:
    """``podman system service`` on a socket in ``workdir``; a context manager, stopped by PID."""

    def __init__(self, workdir: str | None = None, *, start_timeout_s: float = 30.0) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="agentloop-podman-"))
        self.socket = self.workdir / "podman.sock"
        self.url = f"unix://{self.socket}"
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PodmanService:
        reason = podman_missing()
        if reason:
            raise SandboxError(f"cannot start podman: {reason}")
        conf = self.workdir / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        log = open(self.workdir / "service.log", "wb")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            ["podman", "system", "service", "--time=0", self.url],
            cwd=self.workdir,  # its helpers drop files in the cwd (conmon: `oom` on an OOM kill)
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.socket.exists() and self._ping():
                return self
            time.sleep(0.1)
        self.stop()
        tail = (self.workdir / "service.log").read_text(errors="replace")[-2000:]
        raise SandboxError(f"podman system service did not come up: {tail}")

    def _ping(self) -> bool:
        try:
            self.client().ping()
            return True
        except Exception:
            return False

    def client(self) -> Any:
        import docker

        return docker.DockerClient(base_url=self.url, timeout=120)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PodmanService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _needed_libs(binaries: list[str]) -> set[str]:
    out: set[str] = set()
    for path in binaries:
        res = subprocess.run(["ldd", path], capture_output=True, text=True, check=False)
        out.update(re.findall(r"(/\S+\.so[^\s]*)", res.stdout))
    return out


def _rootfs_tar(python: str) -> bytes:
    """A minimal root filesystem: the host's python3 + stdlib, bash, dash as sh, their libs."""
    exe = os.path.realpath(python)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    out = subprocess.run(
        [exe, "-c", "import sys, sysconfig; print(sysconfig.get_paths()['stdlib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    stdlib = out.stdout.strip() or f"/usr/lib/{version}"
    dynload = Path(stdlib) / "lib-dynload"
    shells = [p for p in ("/usr/bin/bash", "/usr/bin/dash") if os.path.exists(p)]
    libs = _needed_libs([exe, *shells, *map(str, dynload.glob("*.so"))])
    buf = io.BytesIO()

    def skip_tests(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = ti.name.split("/")
        return None if "test" in parts or "idlelib" in parts or "tkinter" in parts else ti

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d, mode in (("usr/bin", 0o755), ("tmp", 0o1777), ("sandbox", 0o1777), ("etc", 0o755)):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, mode
            tar.addfile(ti)
        for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname = tarfile.SYMTYPE, target
            tar.addfile(ti)
        tar.add(exe, "usr/bin/python3")
        for shell in shells:
            tar.add(shell, shell.lstrip("/"))
        if "/usr/bin/dash" in shells:
            tar.add("/usr/bin/dash", "usr/bin/sh")
        tar.add(stdlib, stdlib.lstrip("/"), filter=skip_tests)
        for lib in sorted(libs):
            arc = lib if lib.startswith("/usr/") else "/usr" + lib  # merged /usr layout
            tar.add(os.path.realpath(lib), arc.lstrip("/"))
        for name, data in _ETC.items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def build_python_image(
    client: Any, tag: str = DEFAULT_IMAGE, python: str = "/usr/bin/python3"
) -> str:
    """Import a minimal image built from the host's ``python`` (offline); returns its id."""
    repo, _, version = tag.rpartition(":") if ":" in tag else (tag, "", "latest")
    data = _rootfs_tar(python)
    client.api.import_image_from_data(data, repository=repo, tag=version)
    image = client.images.get(f"{repo}:latest")
    if version != "latest":
        image.tag(repo, version)
    return str(image.id)


def ensure_python_image(client: Any, tag: str = DEFAULT_IMAGE) -> str:
    """The image id of ``tag``, building it from the host's Python first if it is missing."""
    import docker

    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        return build_python_image(client, tag)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentloop.sandboxes.podman", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--dir", default=None, help="where the socket and config go")
    parser.add_argument("--build-image", action="store_true", help="build the default image")
    parser.add_argument(
        "--serve", action="store_true", help="keep the service running until interrupted"
    )
    args = parser.parse_args(argv)
    with PodmanService(args.dir) as service:
        if args.build_image:
            start = time.monotonic()
            image = ensure_python_image(service.client())
            print(f"image {DEFAULT_IMAGE} = {image} ({time.monotonic() - start:.1f}s)")
        print(f"engine at {service.url}")
        if args.serve:
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
