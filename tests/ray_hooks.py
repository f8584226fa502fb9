"""Set-up run in every Ray worker of the Ray tests (``runtime_env={"worker_process_setup_hook": ...}``).

Each actor's task appends ``<pid> <node id>\\n`` to the file named by ``COSYCLONE_TEST_PID_FILE`` as
it starts, so a test can kill a worker known to be mid-batch, and see on which node each task ran.
The hook lives here, in the tests: the product carries no test hooks, and this one wraps the
product's actor from outside.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

PID_FILE_ENV = "COSYCLONE_TEST_PID_FILE"


def task_starts(path: Any) -> list[tuple[int, str]]:
    """(pid, node id) of each task start the hook recorded, in order."""
    out = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for line in lines:
        pid, _, node = line.partition(" ")
        out.append((int(pid), node))
    return out


def record_task_starts() -> None:
    """Wrap the actor's task so that each task writes this worker's pid and node first."""
    from cosyclone.ray import actor as ray_actor

    real = ray_actor.SynthActor.run
    if getattr(real, "_records_pid", False):
        return

    def run(self: Any, *args: Any) -> Iterator[Any]:
        path = os.environ.get(PID_FILE_ENV)
        if path:
            import ray

            node = ray.get_runtime_context().get_node_id()
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"{os.getpid()} {node}\n")
        for item in real(self, *args):  # noqa: UP028 - not ``yield from``: Ray sends values into the generator
            yield item

    run._records_pid = True  # type: ignore[attr-defined]
    ray_actor.SynthActor.run = run  # type: ignore[method-assign,assignment]
