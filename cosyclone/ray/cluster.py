"""The Ray cluster as a run sees it: its nodes' shapes (cores, GPUs, memory), read from a live
cluster or predicted for the local Ray a run would start, and the plan made on them.

Split from :mod:`.plan` (the sizing rule, pure arithmetic on node shapes) because this part
talks to Ray: connecting, reading the nodes, disconnecting.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import torch

from cosyclone.base.device import DevicePolicy
from cosyclone.errors import CosycloneError
from cosyclone.model.config import ModelConfig
from cosyclone.ray.plan import NodeShape, RayPlan, plan_run

#: Ray's default share of a node's available memory for its object store (the rest is the logical
#: ``memory`` resource actors reserve from); used only to predict a local Ray that is not started yet.
OBJECT_STORE_SHARE = 0.3


def read_cluster(ray: Any) -> tuple[NodeShape, ...]:
    """The alive nodes of the cluster ``ray`` is connected to, as Ray schedules them.

    GPU memory is not a Ray resource: each GPU node's is taken to be the driver's first GPU's (a
    cluster of one GPU model), or unknown (None) on a driver without one.
    """
    gpu_memory = _driver_gpu_memory()
    seen: dict[str, int] = {}
    out = []
    for node in ray.nodes():
        if not node.get("Alive", False):
            continue
        res = node.get("Resources", {}) or {}
        name = str(node.get("NodeManagerAddress") or node.get("NodeID", "node"))[:40]
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}#{seen[name]}"
        gpus = float(res.get("GPU", 0.0))
        out.append(
            NodeShape(
                name=name,
                cpus=float(res.get("CPU", 0.0)),
                gpus=gpus,
                memory_bytes=int(res.get("memory", 0)),
                gpu_memory_bytes=gpu_memory if gpus else None,
                node_id=str(node.get("NodeID", "")),
            )
        )
    return tuple(out)


def _driver_gpu_memory() -> int | None:
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def local_node() -> NodeShape:
    """This machine as a local Ray started now would see it (for a dry run that starts no Ray):
    its CPUs, its GPUs, and 70% of its available memory (Ray keeps 30% for the object store)."""
    return NodeShape(name="this machine", cpus=float(os.cpu_count() or 1),
                     gpus=float(torch.cuda.device_count()) if torch.cuda.is_available() else 0.0,
                     memory_bytes=int(_available_memory() * (1 - OBJECT_STORE_SHARE)),
                     gpu_memory_bytes=_driver_gpu_memory())


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def cluster_nodes(address: str | None = None) -> tuple[tuple[NodeShape, ...], str]:
    """The nodes a run with ``--ray-address address`` would get, and where they were read from.

    Connected already: that cluster. ``address`` given, or a cluster ``ray start`` began here: the
    driver connects, reads the nodes and disconnects (seconds). Otherwise: this machine as the local
    Ray the run would start (:func:`local_node`; nothing is started).
    """
    ray = require_ray()
    if ray.is_initialized():
        return read_cluster(ray), "the connected Ray cluster"
    try:
        init(ray, address=address or "auto", log_to_driver=False, logging_level="error")
    except ConnectionError:
        if address is not None:
            raise CosycloneError(f"--ray-address {address}: no Ray cluster answers there") from None
        return (local_node(),), "this machine (the local Ray the run would start)"
    try:
        return read_cluster(ray), f"the Ray cluster at {address or 'auto'}"
    finally:
        ray.shutdown()


def plan_cluster(cfg: ModelConfig, policy: DevicePolicy, batch_size: int, *, address: str | None = None,
                 actors: int | None = None, threads: int | None = None) -> RayPlan:
    """The plan a run would get now (:func:`cluster_nodes`), for a dry run and the refusal before any
    work; the run itself plans again on the live cluster (:class:`cosyclone.ray.pool.RaySource`)."""
    from dataclasses import replace

    nodes, where = cluster_nodes(address)
    plan = plan_run(cfg, policy, batch_size, nodes, actors=actors, threads=threads)
    return replace(plan, notes=(*plan.notes, f"nodes: {where}"))


INSTALL_HINT = ("--engine ray needs Ray: from the cosyclone checkout, pip install -e '.[ray]' "
                "(or pip install 'ray[data]>=2.44')")


def init(ray: Any, **kwargs: Any) -> None:
    """``ray.init(**kwargs)``, keeping this process's SIGTERM handler.

    ``ray.init`` installs its own in the driver (an exit on the spot, before a run could write its
    accounts); a run's handler, which stops it gracefully, is put back (on the main thread only:
    elsewhere Python sets no handlers, and Ray sets none either)."""
    if threading.current_thread() is not threading.main_thread():
        ray.init(**kwargs)
        return
    handler = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**kwargs)
    finally:
        signal.signal(signal.SIGTERM, handler if handler is not None else signal.SIG_DFL)


def require_ray() -> Any:
    """The ``ray`` module, or a :class:`CosycloneError` that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise CosycloneError(f"{INSTALL_HINT} ({exc})") from None
    return ray
