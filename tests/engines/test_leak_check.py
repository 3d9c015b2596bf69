"""The suite's vLLM leak check finds orphans: processes whose parent died before them."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from agentloop.testing.processes import vllm_processes

# The parent starts a sleeper that looks like a vLLM module in its command line, then exits:
# the sleeper is re-parented away from the test process but stays in its process group.
ORPHAN_MAKER = (
    "import subprocess, sys\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
    "'vllm.entrypoints.openai.api_server'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "print(p.pid)\n"
)


def test_an_orphaned_vllm_process_is_found_and_only_it() -> None:
    started = time.time()
    before = {p.pid for p in vllm_processes(since=started)}
    out = subprocess.run(
        [sys.executable, "-c", ORPHAN_MAKER], capture_output=True, text=True, check=True
    )
    orphan = psutil.Process(int(out.stdout))
    try:
        assert orphan.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
        found = {p.pid for p in vllm_processes(since=started)} - before
        assert found == {orphan.pid}
        assert orphan.pid not in {p.pid for p in vllm_processes(since=time.time() + 5)}
    finally:
        orphan.kill()
        psutil.wait_procs([orphan], timeout=10)
    assert orphan.pid not in {p.pid for p in vllm_processes(since=started)}
