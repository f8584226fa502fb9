"""How many ``--engine ray`` actors a cluster holds, with how many threads, and what each asks Ray for.

Owns the sizing rule: the per-actor memory footprint (measured: :mod:`cosyclone.ray.footprint`), the shape
of the cluster's nodes (:func:`read_cluster`, :func:`local_node`), and the plan (:class:`RayPlan`) that
``synth --dry-run --engine ray`` shows, that refuses a run that cannot fit before any model loads
(:meth:`RayPlan.check`), that ``runs.jsonl`` records (:meth:`RayPlan.as_record`) and that
:class:`cosyclone.ray.pool.ActorPool` places.

Must not: start actors or load a model (planning is arithmetic on node shapes and the model's
geometry; the only Ray calls are reading a cluster's nodes), or print (``describe()`` returns lines).

The rule (docs/ray.md, "Sizing"):

* CPU: each actor runs ``threads`` torch threads (default :data:`DEFAULT_CPU_THREADS`, the figure
  ``benchmarks/bench_ray.py`` backs); a node holds ``min(cores // threads, memory // footprint)``
  actors. When memory, not cores, is the bound on every node, the cores the actors get are shared
  out among them (``threads = min over nodes of cores // actors``), so a big node's cores are not left idle.
* GPU: one actor per GPU; ``k`` actors per GPU (``num_gpus=1/k``) only when ``--ray-actors`` asks
  for more actors than GPUs and the GPU memory holds ``k`` footprints.
* Every actor asks Ray for ``memory=`` its footprint (Ray's logical memory resource), so no node is
  handed more actors than its memory holds, whatever Ray's placement; ``num_cpus`` is half the
  actor's threads (:data:`CPU_SHARE`), which leaves room for Ray's own workers and the driver on
  small machines (whole-CPU actors on a 2-core machine take every CPU and a task waits for ever).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cosyclone.base.device import DevicePolicy
from cosyclone.errors import CosycloneError
from cosyclone.model.config import ModelConfig
from cosyclone.ray.footprint import Footprint, actor_footprint

#: torch threads per CPU actor when ``--actor-threads`` is not given: on the 2-core AMD EPYC (Zen 4)
#: ``benchmarks/bench_ray.py`` measured, once loaded, 2 actors x 1 thread at 1.20x the rows/s of
#: 1 actor x 2 threads and 1.04x the local engine at 2 threads, on the same rows (docs/ray.md table).
DEFAULT_CPU_THREADS = 1
#: A CPU actor asks Ray for this many CPUs per torch thread (see the module docstring).
CPU_SHARE = 0.5
#: The CPUs a GPU actor asks for next to its GPU (frontend, padding, numpy), unless ``--actor-threads``.
GPU_ACTOR_CPUS = 1.0

@dataclass(frozen=True)
class NodeShape:
    """One node as Ray schedules it (its resources, not the hardware's)."""

    name: str  # the node's id (or a label in tests), for messages
    cpus: float  # Ray's CPU resource of the node
    gpus: float = 0.0  # Ray's GPU resource of the node
    memory_bytes: int = 0  # Ray's logical ``memory`` resource: what actors may reserve there
    gpu_memory_bytes: int | None = None  # memory of each of its GPUs (None: not known)
    node_id: str = ""  # Ray's id of the node, where actors are placed ("": a node predicted, not read)


@dataclass(frozen=True)
class NodePlan:
    """What the plan puts on one node."""

    name: str  # the node's id
    cpus: float  # its CPU resource
    gpus: float  # its GPU resource
    memory_bytes: int  # its memory resource (what actors may reserve)
    room: int  # actors it has room for under the rule (cores, memory, GPUs)
    actors: int  # actors the run may place here: min(room, the run's total)
    bound: str  # what limits ``room``: "cores" | "memory" | "gpus" | "gpu memory"
    node_id: str = ""  # Ray's id of the node ("": predicted): the pool pins its actors here


@dataclass(frozen=True)
class RayPlan:
    """A Ray run's actors: how many, where, with what, and whether it fits."""

    device: str  # "cpu" or "cuda" (the policy's device type)
    dtype: str  # the run dtype's name (fp32 | bf16 | fp16)
    actors: int  # the actor pool's size (0 when nothing fits)
    threads: int | None  # torch threads per actor (None: torch's default in a GPU actor)
    num_cpus: float  # CPUs each actor asks Ray for
    num_gpus: float  # GPUs each actor asks for (0 on CPU; 1/k for k actors per GPU)
    memory_bytes: int  # Ray ``memory`` each actor asks for: the host footprint
    footprint: Footprint  # the figures behind memory_bytes
    nodes: tuple[NodePlan, ...]  # per alive node of the cluster
    requested_actors: int | None = None  # --ray-actors (None: the rule)
    requested_threads: int | None = None  # --actor-threads (None: the rule)
    refusal: str | None = None  # why the run cannot start (None: it fits); check() raises it
    notes: tuple[str, ...] = field(default=())  # what the rule decided and why (shown by describe)

    def node_bytes(self, node: NodePlan) -> int:
        """The most memory the run's actors hold on ``node`` (its ``actors`` x the host footprint)."""
        return node.actors * self.footprint.host_bytes

    def remote_args(self) -> dict[str, float]:
        """What each actor asks Ray for (``.options`` keywords of the actor class)."""
        args = {"num_cpus": self.num_cpus, "memory": float(self.memory_bytes)}
        if self.num_gpus:
            args["num_gpus"] = self.num_gpus
        return args

    def check(self) -> None:
        """Raise :class:`CosycloneError` with the figures when the run cannot fit (before any model loads)."""
        if self.refusal is not None:
            raise CosycloneError(self.refusal)

    def pool_size(self, batches: int) -> int:
        """The pool for ``batches`` planned batches: never more actors than batches."""
        return max(1, min(self.actors, batches))

    def describe(self) -> list[str]:
        """Lines for ``synth --dry-run --engine ray``: the actors per node, threads and expected memory."""
        fp = self.footprint
        who = (f"{self.threads} torch thread{'s' if self.threads != 1 else ''}" if self.threads is not None
               else "torch's default threads")
        gpu = f", {self.num_gpus:g} GPU ({_gb(fp.gpu_bytes)} GB on it)" if self.num_gpus else ""
        lines = [f"ray plan: {self.actors} actors on {self.device} ({self.dtype}), each {who}; asks Ray for "
                 f"{self.num_cpus:g} CPU{gpu} and {_gb(self.memory_bytes)} GB memory"]
        if self.device == "cpu":
            lines.append(
                f"  per actor: {_gb(fp.host_bytes)} GB = {_gb(fp.base_bytes)} base + {_gb(fp.weights_bytes)} "
                f"weights + the larger of the load's peak ({_gb(fp.load_peak_bytes)}) and a first batch of "
                f"{fp.batch_size} rows ({_gb(fp.batch_bytes)}); {fp.source}"
            )
        else:
            lines.append(
                f"  per actor: {_gb(fp.host_bytes)} GB of host memory, {_gb(fp.gpu_bytes)} GB on its GPU = "
                f"{_gb(fp.weights_bytes)} weights + {_gb(fp.batch_bytes)} for a first batch of "
                f"{fp.batch_size} rows; {fp.source}"
            )
        for n in self.nodes:
            gpus = f", {n.gpus:g} GPUs" if n.gpus else ""
            lines.append(
                f"  node {n.name}: {n.cpus:g} CPUs{gpus}, {_gb(n.memory_bytes)} GB memory -> room for "
                f"{n.room} ({n.bound}), up to {n.actors} here holding {_gb(self.node_bytes(n))} GB"
            )
        lines += [f"  {note}" for note in self.notes]
        if self.refusal is not None:
            lines.append(f"  refused: {self.refusal}")
        return lines

    def as_record(self) -> dict[str, Any]:
        """The plan as JSON-able data (a ``runs.jsonl`` field)."""
        return {
            "actors": self.actors,
            "threads": self.threads,
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "memory_bytes": self.memory_bytes,
            "device": self.device,
            "dtype": self.dtype,
            "requested_actors": self.requested_actors,
            "requested_threads": self.requested_threads,
            "footprint": self.footprint.as_record(),
            "nodes": [
                {
                    "name": n.name,
                    "node_id": n.node_id,
                    "cpus": n.cpus,
                    "gpus": n.gpus,
                    "memory_bytes": n.memory_bytes,
                    "room": n.room,
                    "actors": n.actors,
                    "bound": n.bound,
                    "expected_bytes": self.node_bytes(n),
                }
                for n in self.nodes
            ],
            "refusal": self.refusal,
        }


def _gb(n: int | float) -> str:
    return f"{n / 1e9:.1f}"


# ------------------------------------------------------------------------------------------------
# The rule


def _room_cpu(node: NodeShape, threads: int, fp: Footprint) -> tuple[int, str]:
    """Actors of ``threads`` threads ``node`` holds, and what bounds it."""
    by_cores = int(node.cpus // threads)
    by_memory = int(node.memory_bytes // fp.host_bytes)
    return (by_cores, "cores") if by_cores <= by_memory else (by_memory, "memory")


def _room_gpu(node: NodeShape, per_gpu: int, num_cpus: float, fp: Footprint) -> tuple[int, str]:
    """Actors ``node`` holds at ``per_gpu`` actors per GPU, each asking ``num_cpus``, and what bounds it."""
    bounds = {"gpus": int(node.gpus) * per_gpu, "memory": int(node.memory_bytes // fp.host_bytes),
              "cores": int(node.cpus // num_cpus)}
    bound = min(bounds, key=lambda k: bounds[k])  # the first of the smallest: gpus before memory before cores
    return bounds[bound], bound


Rooms = Sequence[tuple[NodeShape, tuple[int, str]]]


def _nodes(rooms: Rooms, total: int) -> tuple[NodePlan, ...]:
    return tuple(
        NodePlan(
            name=n.name,
            cpus=n.cpus,
            gpus=n.gpus,
            memory_bytes=n.memory_bytes,
            room=room,
            actors=min(room, total),
            bound=bound,
            node_id=n.node_id,
        )
        for n, (room, bound) in rooms
    )


def _fits(rooms: Rooms) -> str:
    return "; ".join(f"{n.name}: {room} ({bound}: {n.cpus:g} CPUs, {n.gpus:g} GPUs, {_gb(n.memory_bytes)} GB)"
                     for n, (room, bound) in rooms) or "no node"


def plan_actors(nodes: Sequence[NodeShape], policy: DevicePolicy, footprint: Footprint, *,
                actors: int | None = None, threads: int | None = None) -> RayPlan:
    """The plan for ``nodes`` (alive nodes of a cluster) under the rule of the module docstring.

    ``actors`` / ``threads`` are ``--ray-actors`` / ``--actor-threads`` (None: the rule). Never
    raises for a run that does not fit: the plan carries the refusal (``refusal``, raised by
    :meth:`RayPlan.check`), so a dry run can show it with the figures.
    """
    for flag, value in (("--ray-actors", actors), ("--actor-threads", threads)):
        if value is not None and value < 1:
            raise CosycloneError(f"{flag} must be at least 1, not {value}")
    if policy.device.type == "cpu":
        return _plan_cpu(tuple(nodes), policy, footprint, actors, threads)
    return _plan_gpu(tuple(nodes), policy, footprint, actors, threads)


def _plan_cpu(nodes: tuple[NodeShape, ...], policy: DevicePolicy, fp: Footprint, actors: int | None,
              threads: int | None) -> RayPlan:
    base = threads or DEFAULT_CPU_THREADS
    rooms = [(n, _room_cpu(n, base, fp)) for n in nodes]
    capacity = sum(r for _, (r, _) in rooms)
    notes: list[str] = []
    refusal = None
    s = "s" if base > 1 else ""
    if capacity == 0:
        refusal = (
            f"no node has room for one actor: it needs {_gb(fp.host_bytes)} GB of memory "
            f"({_gb(fp.base_bytes)} "
            f"base + {_gb(fp.weights_bytes)} weights in {policy.dtype_name} + "
            f"{_gb(max(fp.load_peak_bytes, fp.batch_bytes))} for the load's peak or a batch of "
            f"{fp.batch_size} rows) and {base} CPU{s} for {base} torch thread{s}; the cluster has "
            f"{_fits(rooms)}. "
            + (
                "Try --dtype bf16 (smaller weights) or a smaller --batch-size"
                if policy.dtype_name == "fp32"
                else "Try a smaller --batch-size"
            )
        )
    elif actors is not None and actors > capacity:
        at_one = sum(_room_cpu(n, 1, fp)[0] for n in nodes)
        refusal = (f"--ray-actors {actors} asks for more actors than fit: {capacity} actors of {base} torch "
                   f"thread{s} and {_gb(fp.host_bytes)} GB fit ({_fits(rooms)})"
                   + (f"; at --actor-threads 1, {at_one} fit" if base > 1 and at_one > capacity else ""))
    want = capacity if actors is None else min(actors, capacity)
    chosen = base
    if threads is None and want > 0:  # the most threads at which the wanted actors still fit
        for t in range(int(max(n.cpus for n in nodes)), base, -1):
            if sum(_room_cpu(n, t, fp)[0] for n in nodes) >= want:
                chosen = t
                break
        if chosen > base:
            notes.append(f"threads: {chosen} per actor, the most at which {want} actors still fit "
                         f"(the cores they get; {DEFAULT_CPU_THREADS} where cores, not memory, bind)")
            rooms = [(n, _room_cpu(n, chosen, fp)) for n in nodes]
    if actors is not None and actors < capacity:
        notes.append(f"--ray-actors {actors}: the cluster has room for {capacity}")
    return RayPlan(
        device="cpu",
        dtype=policy.dtype_name,
        actors=want,
        threads=chosen,
        num_cpus=CPU_SHARE * chosen,
        num_gpus=0.0,
        memory_bytes=fp.host_bytes,
        footprint=fp,
        nodes=_nodes(rooms, want),
        requested_actors=actors,
        requested_threads=threads,
        refusal=refusal,
        notes=tuple(notes),
    )


def _per_gpu_refusal(
    nodes: tuple[NodeShape, ...], fp: Footprint, actors: int, gpus: int, per_gpu: int
) -> str | None:
    """Why ``per_gpu`` actors on each GPU do not fit (None: they do). GPU memory is no Ray resource:
    Ray would put ``per_gpu`` on any GPU, so every GPU node must hold them."""
    for n in nodes:
        if not int(n.gpus):
            continue
        if n.gpu_memory_bytes is None:
            return (
                f"--ray-actors {actors} asks for {per_gpu} actors per GPU ({gpus} GPUs in the cluster), "
                f"but the GPU memory of {n.name} is not known, so only one actor per GPU is planned; "
                f"ask for at most {gpus}"
            )
        holds = int(n.gpu_memory_bytes // fp.gpu_bytes) if fp.gpu_bytes else per_gpu
        if holds < per_gpu:
            return (
                f"--ray-actors {actors} asks for {per_gpu} actors per GPU ({gpus} GPUs in the cluster); "
                f"a GPU of {n.name} has {_gb(n.gpu_memory_bytes)} GB and one actor needs "
                f"{_gb(fp.gpu_bytes)} GB there ({_gb(fp.weights_bytes)} weights + "
                f"{_gb(fp.batch_bytes)} first batch): {holds} per GPU fit, "
                f"{holds * gpus} actors in all"
            )
    return None


def _plan_gpu(nodes: tuple[NodeShape, ...], policy: DevicePolicy, fp: Footprint, actors: int | None,
              threads: int | None) -> RayPlan:
    gpus = sum(int(n.gpus) for n in nodes)
    notes: list[str] = []
    refusal = None
    per_gpu = 1
    if gpus and actors is not None and actors > gpus:
        per_gpu = math.ceil(actors / gpus)
        refusal = _per_gpu_refusal(nodes, fp, actors, gpus, per_gpu)
        if refusal is None:
            notes.append(f"{per_gpu} actors per GPU (--ray-actors {actors} over {gpus} GPUs; "
                         f"each asks {1 / per_gpu:.3g} GPU)")
        else:
            per_gpu = 1
    num_cpus = GPU_ACTOR_CPUS if threads is None else CPU_SHARE * threads
    rooms = [(n, _room_gpu(n, per_gpu, num_cpus, fp)) for n in nodes]
    capacity = sum(r for _, (r, _) in rooms)
    if refusal is None:
        if not gpus:
            refusal = (
                f"the run is planned on {policy.device.type} (resolved by the driver) but the cluster has no "
                "GPU; start it from a CPU machine or with --device cpu to run on CPU actors"
            )
        elif capacity == 0 or (actors is not None and actors > capacity):
            what = (
                "no node has room for one actor"
                if capacity == 0
                else f"--ray-actors {actors} asks for more than fit"
            )
            refusal = (
                f"{what}: each needs {_gb(fp.host_bytes)} GB of host memory and {num_cpus:g} CPU beside its "
                f"GPU; room: {_fits(rooms)}"
            )
    want = capacity if actors is None else min(actors, capacity)
    return RayPlan(
        device=policy.device.type,
        dtype=policy.dtype_name,
        actors=want,
        threads=threads,
        num_cpus=num_cpus,
        num_gpus=1.0 / per_gpu,
        memory_bytes=fp.host_bytes,
        footprint=fp,
        nodes=_nodes(rooms, want),
        requested_actors=actors,
        requested_threads=threads,
        refusal=refusal,
        notes=tuple(notes),
    )


def plan_run(cfg: ModelConfig, policy: DevicePolicy, batch_size: int, nodes: Sequence[NodeShape], *,
             actors: int | None = None, threads: int | None = None) -> RayPlan:
    """:func:`plan_actors` with this model's footprint (:func:`actor_footprint`) at ``batch_size``."""
    return plan_actors(
        nodes, policy, actor_footprint(cfg, policy, batch_size), actors=actors, threads=threads
    )
