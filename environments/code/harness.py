"""Runs inside the sandbox: set resource limits, signal that the sandbox started, run the solution.

Usage: `python3 -I harness.py MODE READY_FD LIMITS_JSON` with `solution.py` (and, for MODE
`call`, `tests.json`) beside it (in /sandbox, read-only). MODE `stdin` runs the solution as `__main__` on
the real stdin. MODE `call` imports it, calls `fn_name` on each test's arguments and writes one
JSON line `{"results": [...]}` to the original stdout (the solution's own prints go to stderr).
Standard library only: this file is copied into every sandbox and runs under the system Python.
"""

import json
import os
import resource
import runpy
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

PRELUDE = (
    "from typing import *\n"
    "import collections, heapq, bisect, itertools, functools, math, string, re, operator\n"
    "from collections import *\n"
    "from heapq import *\n"
    "from bisect import *\n"
    "from itertools import *\n"
    "from functools import *\n"
    "from math import *\n"
)
"""Names LeetCode-style solutions use without importing them (`List`, `deque`, `inf`, ...)."""


def set_limits(limits):
    for name, value in (
        ("RLIMIT_CPU", (limits["cpu_time_s"], limits["cpu_time_s"] + 1)),
        ("RLIMIT_AS", (limits["memory_bytes"],) * 2),
        ("RLIMIT_NPROC", (limits["max_processes"],) * 2),
        ("RLIMIT_FSIZE", (limits["max_file_bytes"],) * 2),
        ("RLIMIT_NOFILE", (limits["max_open_files"],) * 2),
        ("RLIMIT_CORE", (0, 0)),
    ):
        resource.setrlimit(getattr(resource, name), value)


def to_json(value):
    if isinstance(value, tuple):
        value = list(value)
    try:
        json.dumps(value)
        return {"value": value}
    except (TypeError, ValueError):
        return {"repr": repr(value)}


def run_calls():
    with open(os.path.join(HERE, "tests.json"), encoding="utf-8") as handle:
        tests = json.load(handle)
    results_fd = os.dup(1)
    os.dup2(2, 1)  # the solution's prints must not mix with the results
    sys.stdout = sys.stderr
    namespace = {"__name__": "solution"}
    with open(os.path.join(HERE, "solution.py"), encoding="utf-8") as handle:
        source = handle.read()
    exec(compile(PRELUDE + source, "solution.py", "exec"), namespace)
    target = namespace["Solution"]() if "Solution" in namespace else None
    function = getattr(target, tests["fn_name"], None) if target is not None else namespace.get(tests["fn_name"])
    if not callable(function):
        raise NameError(f"the solution defines no function {tests['fn_name']!r}")
    results = []
    for arguments in tests["arguments"]:
        try:
            results.append(to_json(function(*arguments)))
        except Exception as error:  # one failing call fails the run, with what it raised
            results.append({"error": f"{type(error).__name__}: {error}"})
            break
    os.write(results_fd, (json.dumps({"results": results}) + "\n").encode())


def main():
    mode, ready_fd, limits = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    set_limits(limits)
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    sys.argv = ["solution.py"]
    sys.setrecursionlimit(10_000)
    try:
        if mode == "stdin":
            runpy.run_path(os.path.join(HERE, "solution.py"), run_name="__main__")
        else:
            run_calls()
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
