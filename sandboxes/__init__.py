"""agentloop.sandboxes: run untrusted code — local bubblewrap, Docker, remote server, fake.

    async with make_sandbox("local") as sb:
        print((await sb.run("print(1 + 1)")).stdout)
        async with sb.session() as s:          # a notebook-like kernel
            await s.run("x = 41")
            print((await s.run("print(x + 1)")).stdout)

Backends are registered by name and imported lazily: ``local`` (default), ``docker``, ``remote``,
``fake`` and the explicit, unisolated ``subprocess_unsafe``. ``shared_sandbox(name)`` gives the
running event loop's shared instance (what the code-interpreter tool uses by default);
``sandbox_spec`` reads a ``sandbox:`` setting (a name, server URLs, or a backend with options).
"""

from __future__ import annotations

from agentloop.sandboxes.base import (
    LANGUAGES,
    ExecResult,
    Sandbox,
    SandboxFactory,
    SandboxLimits,
    SandboxSession,
    available_sandboxes,
    make_sandbox,
    register_sandbox,
)
from agentloop.sandboxes.fake import FakeSandbox
from agentloop.sandboxes.shared import shared_sandbox
from agentloop.sandboxes.spec import SandboxConfig, SandboxSpec, sandbox_spec

__all__ = [
    "LANGUAGES",
    "ExecResult",
    "FakeSandbox",
    "Sandbox",
    "SandboxConfig",
    "SandboxFactory",
    "SandboxLimits",
    "SandboxSession",
    "SandboxSpec",
    "available_sandboxes",
    "make_sandbox",
    "register_sandbox",
    "sandbox_spec",
    "shared_sandbox",
]

register_sandbox("local", "agentloop.sandboxes.local:LocalSandbox")
register_sandbox("docker", "agentloop.sandboxes.docker:DockerSandbox")
register_sandbox("remote", "agentloop.sandboxes.remote_pool:RemotePool")
register_sandbox(
    "subprocess_unsafe", "agentloop.sandboxes.subprocess_unsafe:UnsafeSubprocessSandbox"
)
register_sandbox("fake", FakeSandbox)
