"""Set-up run in every Ray worker of the Ray tests (``runtime_env={"worker_process_setup_hook": ...}``).

Each actor's task appends ``<pid>\\n`` to the file named by ``COSYCLONE_TEST_PID_FILE`` as it starts,
so a test can kill a worker known to be mid-batch. The hook lives here, in the tests: the product
carries no test hooks, and this one wraps the product's actor from outside.
"""

from __future__ import annotations

import os
from typing import Any

PID_FILE_ENV = "COSYCLONE_TEST_PID_FILE"


def record_task_starts() -> None:
    """Wrap the actor's call so that each task writes this worker's pid first."""
    from cosyclone.run import ray_pool

    real = ray_pool.SynthActor.__call__
    if getattr(real, "_records_pid", False):
        return

    def call(self: Any, batch: Any) -> Any:
        path = os.environ.get(PID_FILE_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"{os.getpid()}\n")
        return real(self, batch)

    call._records_pid = True  # type: ignore[attr-defined]
    ray_pool.SynthActor.__call__ = call  # type: ignore[method-assign]
