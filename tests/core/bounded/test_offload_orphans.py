"""Worker processes of `run_in_process` die with the process that started them (issue 9 item 10)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = """
    import asyncio, os, time
    import multiprocessing.forkserver as forkserver
    from gym_bridge.core.bounded.offload import run_in_process, set_pool_size

    async def start_both_workers():
        await asyncio.gather(*(run_in_process(time.sleep, 0.2, timeout_s=30) for _ in range(2)))

    if __name__ == "__main__":
        set_pool_size(2)
        asyncio.run(start_both_workers())
        from gym_bridge.core.bounded.offload import _POOL
        workers = _POOL.worker_pids()
        print(" ".join(map(str, [*workers, forkserver._forkserver._forkserver_pid])), flush=True)
        time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_workers_die_when_their_parent_is_killed(tmp_path: Path, how: signal.Signals) -> None:
    """kill -9 or SIGTERM of the caller leaves no worker or forkserver process behind."""
    script = tmp_path / "pool_owner.py"
    script.write_text(textwrap.dedent(SCRIPT))
    root = Path(__file__).resolve().parents[3]
    process = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": str(root)},
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        pids = [int(pid) for pid in line.split()]
        assert len(pids) == 3, line
        assert all(_alive(pid) for pid in pids)
        process.send_signal(how)
        process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in pids if _alive(pid)] == []
    finally:
        process.kill()
        process.wait()
