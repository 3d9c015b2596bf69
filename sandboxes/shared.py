"""One shared, started sandbox per event loop and backend name, closed when that loop shuts down."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator

from agentloop.sandboxes.base import Sandbox
from agentloop.sandboxes.spec import SandboxConfig, SandboxSpec, sandbox_spec

__all__ = ["shared_sandbox", "shared_sandboxes"]

# Per loop: spec (backend and options) -> (sandbox, the keeper generator that closes it).
# Sandboxes hold asyncio resources (subprocess transports, locks) that belong to the loop that
# made them, so a new loop (each ``asyncio.run``) gets its own.
_SHARED: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[SandboxSpec, tuple[Sandbox, AsyncGenerator[None, None]]]
] = weakref.WeakKeyDictionary()


async def _keeper(sandbox: Sandbox) -> AsyncGenerator[None, None]:
    # A suspended async generator is what asyncio closes for us at shutdown:
    # ``asyncio.run``/``Runner.close`` (and so pytest-asyncio) call ``loop.shutdown_asyncgens()``,
    # which runs this ``finally`` on the still-running loop. No other hook runs async clean-up
    # before a loop closes.
    try:
        yield
    finally:
        await sandbox.close()


def shared_sandboxes() -> list[Sandbox]:
    """The shared sandboxes made on the running event loop (for their metrics)."""
    return [sandbox for sandbox, _ in _SHARED.get(asyncio.get_running_loop(), {}).values()]


async def shared_sandbox(backend: SandboxConfig = "local") -> Sandbox:
    """The sandbox ``backend`` names shared by every caller on the running event loop.

    ``backend`` is a backend name, server URLs or a backend with its options (see
    :func:`~agentloop.sandboxes.spec.sandbox_spec`); equal settings share one sandbox.

    Built and started on first use (a failed start is retried by the next call), it serves many
    episodes at once — each opens its own session — and is closed when the loop shuts down
    (``asyncio.run`` returning, ``loop.shutdown_asyncgens()``). Its processes also die with this
    process. For other limits or an explicit lifetime, make your own with :func:`make_sandbox`.
    """
    loop = asyncio.get_running_loop()
    per_loop = _SHARED.setdefault(loop, {})
    spec = sandbox_spec(backend)
    entry = per_loop.get(spec)
    if entry is None:
        sandbox = spec.build()
        keeper = _keeper(sandbox)
        per_loop[spec] = entry = (sandbox, keeper)  # the dict keeps the generator alive
        await keeper.__anext__()  # runs to its ``yield``: the loop now tracks it
    sandbox = entry[0]
    await sandbox.start()
    return sandbox
