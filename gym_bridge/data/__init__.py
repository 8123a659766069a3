"""Task-row files, the back end of `gym-bridge data validate|prepare|mix` (`to-verl` lives in gym_bridge.verl).

`task_files` checks, generates, mixes and writes them; its functions are re-exported here, so
`from gym_bridge.data import validate_file, prepare, mix_files, write_rows` reads as before.
"""

from __future__ import annotations

from gym_bridge.data.task_files import (
    Problem,
    ValidationReport,
    check_row,
    generator_names,
    mix_files,
    prepare,
    read_task_rows,
    validate_file,
    write_rows,
)

__all__ = [
    "Problem", "ValidationReport", "check_row", "generator_names", "mix_files", "prepare", "read_task_rows", "validate_file", "write_rows",
]
