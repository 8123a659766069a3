"""The sandbox's isolation of what test_code_env.py does not cover: the trainer's environment
variables (by every /proc path) and host memory through /dev and /dev/shm.

Each program prints what it could reach, and the test asserts on that text: a leaking sandbox fails.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from environments.code.sandbox import SANDBOX_ENV, Sandbox, SandboxLimits, SandboxResult, default_python, probe
from environments.code.tests.test_code_env import FastCode, score, stdin_row

SANDBOX_PROBLEM = probe(default_python())
needs_sandbox = pytest.mark.skipif(SANDBOX_PROBLEM is not None, reason=f"no working bubblewrap here: {SANDBOX_PROBLEM}")

DUMP_PROC = """
import glob, sys
for pattern in ('/proc/*/environ', '/proc/*/cmdline', '/proc/*/task/*/environ', '/proc/*/task/*/cmdline'):
    for path in glob.glob(pattern):
        try:
            print(path, open(path, 'rb').read().decode('utf-8', 'replace'), file=sys.stderr)
        except OSError as error:
            print(path, error, file=sys.stderr)
sys.exit(1)
"""


def run(program: str, limits: SandboxLimits = SandboxLimits(wall_time_s=20.0)) -> SandboxResult:
    return asyncio.run(Sandbox(limits, max_concurrency=1).run("stdin", program))


@needs_sandbox
def test_no_variable_of_the_trainer_is_visible_by_any_proc_path(monkeypatch) -> None:
    secret = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("GYM_BRIDGE_TEST_SECRET", secret)
    result = run(DUMP_PROC)
    dump = result.stderr.decode()
    assert "/proc/1/environ PATH=/usr/bin:/bin" in dump, dump[:2000]  # PID 1 (bwrap) was read, and shows only ours
    assert secret not in dump and "OPENAI_API_KEY" not in dump and "GYM_BRIDGE_TEST_SECRET" not in dump
    for line in dump.splitlines():
        path, _, content = line.partition(" ")
        if path.endswith("environ"):
            visible = {entry.partition("=")[0] for entry in content.split("\0") if entry}
            assert visible <= {*SANDBOX_ENV, "PWD"}, (path, visible)


@needs_sandbox
def test_the_secret_does_not_reach_the_record_end_to_end(monkeypatch) -> None:
    """The issue's path: a failing solution's stderr becomes `metrics.failure_detail` in every record."""
    secret = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    program = "import sys\nsys.stderr.write(open('/proc/1/environ').read()[-300:])\nsys.exit(1)"
    result = score(stdin_row([""], ["x"]), program, FastCode)
    assert (result.reward, result.metrics["failure"]) == (0.0, "runtime_error")
    assert "PATH=/usr/bin:/bin" in result.metrics["failure_detail"]  # the read itself worked
    assert secret not in json.dumps(result.metrics)


FILL = """
import os, sys
written = 0
for index in range(1000):
    try:
        with open(f'{folder}/fill_{{index}}', 'wb') as handle:
            for _ in range(8):
                handle.write(b'x' * 2**20)
                written += 2**20
    except OSError as error:
        print(written // 2**20, type(error).__name__, error.errno)
        sys.exit(0)
print(written // 2**20, 'no error')
"""


@needs_sandbox
@pytest.mark.parametrize("folder", ["/dev/shm", "/tmp"])
def test_shared_memory_and_tmp_are_capped(folder: str) -> None:
    limits = SandboxLimits(wall_time_s=20.0, shm_mb=16, tmp_mb=24)
    result = run(FILL.format(folder=folder), limits)
    written_mb, error, errno = result.stdout.decode().split()
    cap = limits.shm_mb if folder == "/dev/shm" else limits.tmp_mb
    assert (error, errno) == ("OSError", "28"), result  # ENOSPC: the tmpfs is full
    assert int(written_mb) <= cap


@needs_sandbox
def test_the_rest_of_dev_is_read_only_but_its_devices_work() -> None:
    program = (
        "import errno\n"
        "try:\n    open('/dev/escape', 'wb').write(b'x')\n    print('wrote /dev')\n"
        "except OSError as error:\n    print(errno.errorcode[error.errno])\n"
        "open('/dev/null', 'wb').write(b'x')\nprint(len(open('/dev/urandom', 'rb').read(4)))\n"
        "import multiprocessing\nmultiprocessing.Lock()\nprint('lock')"
    )
    result = run(program)
    assert result.stdout.decode().split() == ["EROFS", "4", "lock"], result


SYSV_IPC = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm_id = libc.shmget(0, 64 * 2**20, 0o1600)
if shm_id >= 0:
    address = libc.shmat(shm_id, None, 0)
    ctypes.memset(address, 1, 64 * 2**20)  # 64 MB of host memory outside RLIMIT_AS once detached
    libc.shmdt(ctypes.c_void_p(address))
    print('shm', shm_id)
else:
    print('shm', os.strerror(ctypes.get_errno()))
print('sem', libc.semget(0, 4, 0o1600) >= 0, 'msg', libc.msgget(0, 0o1600) >= 0)
"""


@needs_sandbox
def test_sysv_shared_memory_semaphores_and_queues_cannot_be_created() -> None:
    """SysV IPC objects outlive their creator inside the run's IPC namespace and count against no
    rlimit: shared memory blocks of 100 MB, attached, filled and detached in a loop, held 800 MB of host memory."""
    result = run(SYSV_IPC)
    assert result.stdout.decode().split("\n")[:2] == ["shm Operation not permitted", "sem False msg False"], result
