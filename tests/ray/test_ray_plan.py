"""The Ray sizing rule (cosyclone/ray/plan.py) on faked node shapes.

The pure planner runs over the issue's whole grid (2/16/64 cores x 8/64/256 GB x 0/1/8 GPUs, fp32
and bf16, the rule's defaults and explicit asks): every plan that is not refused fits each node's
memory and cores, and every refusal gives the figures. Two tests marked ``ray`` start a real
``ray.init`` with a faked node shape and check that the cluster reader turns it into that shape
and that a run that cannot fit is refused before any actor starts.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from cosyclone.base.device import DevicePolicy
from cosyclone.errors import CosycloneError
from cosyclone.model.config import load_model_config, released_config
from cosyclone.ray.footprint import Footprint, actor_footprint, weight_bytes
from cosyclone.ray.plan import CPU_SHARE, DEFAULT_CPU_THREADS, NodeShape, RayPlan, plan_actors, plan_run

GB = 10**9
CORES, MEMORY, GPUS = (2, 16, 64), (8, 64, 256), (0, 1, 8)


def policy(device: str, dtype: str) -> DevicePolicy:
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    return DevicePolicy(device=torch.device(device), dtype=dt, backend=device, requested_dtype=dtype)


def node(cpus: float, gb: float, gpus: float = 0, gpu_gb: float | None = None, name: str = "n") -> NodeShape:
    return NodeShape(name=name, cpus=cpus, gpus=gpus, memory_bytes=int(gb * GB),
                     gpu_memory_bytes=None if gpu_gb is None else int(gpu_gb * GB))


def released(device: str, dtype: str, batch: int = 8) -> tuple[DevicePolicy, Footprint]:
    p = policy(device, dtype)
    return p, actor_footprint(released_config(), p, batch)


def assert_fits(plan: RayPlan, nodes: list[NodeShape]) -> None:
    """Each node's actors fit its memory (host, and GPU memory where known) and its cores."""
    by_name = {n.name: n for n in nodes}
    assert plan.refusal is None, plan.refusal
    assert plan.actors >= 1 and plan.actors <= sum(n.room for n in plan.nodes)
    assert plan.remote_args()["memory"] == plan.memory_bytes == plan.footprint.host_bytes
    for n in plan.nodes:
        shape = by_name[n.name]
        assert n.actors <= n.room and plan.node_bytes(n) <= shape.memory_bytes
        assert n.room * plan.num_cpus <= shape.cpus  # Ray can place every actor the node has room for
        if plan.device == "cpu":
            # no more torch threads than cores
            assert plan.threads is not None and n.room * plan.threads <= shape.cpus
        else:
            assert n.room * plan.num_gpus <= shape.gpus
            if shape.gpu_memory_bytes is not None:
                per_gpu = round(1 / plan.num_gpus)
                assert per_gpu * plan.footprint.gpu_bytes <= shape.gpu_memory_bytes or per_gpu == 1


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_default_plan_on_the_grid_fits_or_is_refused_with_the_figures(device: str, dtype: str) -> None:
    p, fp = released(device, dtype)
    for cores, gb, gpus in itertools.product(CORES, MEMORY, GPUS):
        nodes = [node(cores, gb, gpus, gpu_gb=80 if gpus else None)]
        plan = plan_actors(nodes, p, fp)
        if device == "cuda" and gpus == 0:
            assert plan.refusal is not None and "no GPU" in plan.refusal
            with pytest.raises(CosycloneError, match="no GPU"):
                plan.check()
            continue
        if plan.refusal is not None:  # only when one actor is larger than the node
            assert fp.host_bytes > gb * GB or (device == "cpu" and cores < DEFAULT_CPU_THREADS)
            assert f"{fp.host_bytes / GB:.1f} GB" in plan.refusal and f"{gb:.1f} GB" in plan.refusal
            continue
        assert_fits(plan, nodes)
        if device == "cuda":
            assert plan.actors == min(gpus, int(gb * GB // fp.host_bytes), cores) and plan.num_gpus == 1.0
        else:  # as many actors as cores and memory allow, and together they use the node's cores
            assert plan.actors == min(cores // DEFAULT_CPU_THREADS, int(gb * GB // fp.host_bytes))
            assert plan.threads == cores // plan.actors and plan.num_cpus == CPU_SHARE * plan.threads
        json.dumps(plan.as_record())  # JSON-able as it stands


def test_the_issues_nodes_get_the_rules_figures() -> None:
    p, fp = released("cpu", "fp32")
    big = plan_actors([node(64, 128)], p, fp)  # the issue's 64-core 128 GB node: memory binds, not cores
    assert big.actors == int(128 * GB // fp.host_bytes) < 64 and big.nodes[0].bound == "memory"
    assert big.threads == 64 // big.actors >= 2  # the cores the actors get
    small = plan_actors([node(2, 64)], p, fp)
    # cores bind: 2 x 1 thread, half a CPU
    assert (small.actors, small.threads, small.num_cpus) == (2, 1, 0.5)
    assert plan_actors([node(2, 9)], p, fp).actors == 1  # one fp32 actor fits 9 GB, two do not
    # bf16 ones fit two to 9.7 GB (9 GB before HiFT's CPU FFT spectra added 0.29 GB to an actor)
    assert plan_actors([node(2, 9.7)], *released("cpu", "bf16")).actors == 2


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_explicit_asks_on_the_grid_fit_or_say_what_does(dtype: str) -> None:
    p, fp = released("cpu", dtype)
    for cores, gb in itertools.product(CORES, MEMORY):
        nodes = [node(cores, gb)]
        for actors, threads in ((1, None), (2, 1), (4, None), (None, 2), (3, 4), (64, 1), (1, 64)):
            plan = plan_actors(nodes, p, fp, actors=actors, threads=threads)
            if plan.refusal is None:
                assert_fits(plan, nodes)
                assert plan.actors == (actors or plan.actors) and plan.threads == (threads or plan.threads)
                assert (plan.requested_actors, plan.requested_threads) == (actors, threads)
                continue
            with pytest.raises(CosycloneError) as err:
                plan.check()
            room = plan_actors(nodes, p, fp, threads=threads)
            assert (actors or 1) > room.actors  # refused only when more is asked than fits
            if room.actors:
                assert f"{room.actors} actors of" in str(err.value)  # says what does fit
            assert f"{fp.host_bytes / GB:.1f} GB" in str(err.value)


def test_an_explicit_actor_count_gets_the_cores_there_are() -> None:
    p, fp = released("cpu", "fp32")
    one = plan_actors([node(16, 256)], p, fp, actors=1)
    assert (one.actors, one.threads, one.nodes[0].actors) == (1, 16, 1)
    assert "room for" in "\n".join(one.describe())
    pinned = plan_actors([node(16, 256)], p, fp, actors=1, threads=2)
    assert (pinned.actors, pinned.threads) == (1, 2)
    with pytest.raises(CosycloneError, match="at least 1"):
        plan_actors([node(2, 8)], p, fp, actors=0)


def test_actors_are_placed_round_robin_over_the_nodes_each_within_its_room() -> None:
    """The pool pins actor k to placement(plan)[k]: a short run (few actors) still uses every node, and no
    node gets more than the plan's room there."""
    from cosyclone.ray.pool import placement

    p, fp = released("cpu", "fp32")
    nodes = [NodeShape(name=f"n{i}", cpus=c, gpus=0, memory_bytes=256 * GB, node_id=f"id{i}")
             for i, c in enumerate((4, 1, 2))]
    full = plan_actors(nodes, p, fp, threads=1)
    assert placement(full) == ["id0", "id1", "id2", "id0", "id2", "id0", "id0"]
    two = plan_actors(nodes, p, fp, actors=2, threads=1)
    assert placement(two) == ["id0", "id1"]
    assert [n.node_id for n in two.nodes] == ["id0", "id1", "id2"] and two.as_record()["nodes"][1][
        "node_id"
    ] == "id1"


def test_heterogeneous_nodes_share_one_thread_count_and_each_fits() -> None:
    p, fp = released("cpu", "fp32")
    nodes = [node(64, 256, name="big"), node(16, 8, name="small"), node(2, 2, name="tiny")]
    plan = plan_actors(nodes, p, fp)
    assert_fits(plan, nodes)
    rooms = {n.name: n.room for n in plan.nodes}
    assert rooms["tiny"] == 0 and rooms["small"] == 1 and rooms["big"] >= 1
    assert plan.actors == sum(rooms.values())
    text = "\n".join(plan.describe())
    assert "node tiny" in text and "room for 0 (memory)" in text


def test_more_than_one_actor_per_gpu_only_when_asked_and_its_memory_holds_them() -> None:
    p, fp = released("cuda", "bf16")
    eight = [node(64, 256, 8, gpu_gb=80)]
    assert plan_actors(eight, p, fp).actors == 8  # the default: one per GPU
    two = plan_actors(eight, p, fp, actors=16)
    assert_fits(two, eight)
    assert (two.actors, two.num_gpus) == (16, 0.5) and two.remote_args()["num_gpus"] == 0.5
    small_gpu = plan_actors([node(64, 256, 8, gpu_gb=fp.gpu_bytes * 1.5 / GB)], p, fp, actors=16)
    assert small_gpu.refusal is not None and "1 per GPU fit, 8 actors in all" in small_gpu.refusal
    unknown = plan_actors([node(64, 256, 8)], p, fp, actors=16)
    assert unknown.refusal is not None and "not known" in unknown.refusal
    fewer = plan_actors(eight, p, fp, actors=3)
    assert (fewer.actors, fewer.num_gpus) == (3, 1.0)


def test_describe_and_record_carry_the_plans_figures() -> None:
    p, fp = released("cpu", "fp32")
    plan = plan_actors([node(16, 64, name="a"), node(16, 64, name="b")], p, fp)
    lines = plan.describe()
    assert lines[0].startswith(
        f"ray plan: {plan.actors} actors on cpu (fp32), each {plan.threads} torch thread"
    )
    assert any(line.startswith("  node a: 16 CPUs, 64.0 GB memory -> room for") for line in lines)
    rec = json.loads(json.dumps(plan.as_record()))
    assert rec["actors"] == plan.actors and rec["threads"] == plan.threads and rec["refusal"] is None
    assert rec["footprint"]["host_bytes"] == fp.host_bytes and len(rec["nodes"]) == 2
    assert all(n["expected_bytes"] <= n["memory_bytes"] for n in rec["nodes"])


def test_the_footprint_counts_the_weights_the_loader_holds(tiny_model_dir: Path) -> None:
    """weight_bytes (meta device, no allocation) equals what load_stages holds, fp32 and bf16."""
    from cosyclone.engine.stages import load_stages

    cfg = load_model_config(tiny_model_dir)
    for dtype in ("fp32", "bf16"):
        stages = load_stages(cfg, policy("cpu", dtype), "auto", text_frontend="none")
        held = sum(t.numel() * t.element_size() for m in (stages.talker, stages.flow, stages.hift)
                   for t in (*m.parameters(), *m.buffers()))
        counted = weight_bytes(cfg, policy("cpu", dtype))
        assert abs(counted - held) <= 0.02 * held, (dtype, counted, held)
    full32, full16 = (weight_bytes(released_config(), policy("cpu", d)) for d in ("fp32", "bf16"))
    assert 3.5 * GB < full32 < 3.8 * GB and full16 < 0.6 * full32  # ~0.85 B parameters and HiFT's FFT spectra
    # (CPU only: ~0.29 GB); bf16 about halves the rest
    tiny = plan_run(cfg, policy("cpu", "fp32"), 4, [node(2, 8)])
    assert tiny.footprint.weights_bytes < 0.1 * GB and tiny.actors == 2  # the e2e tests' two actors


@pytest.mark.ray
def test_a_faked_node_is_read_as_that_shape_and_planned() -> None:
    """ray.init(num_cpus=16, num_gpus=8, _memory=64 GB): the reader sees that node; plans follow it."""
    import ray

    from cosyclone.ray.cluster import cluster_nodes, read_cluster

    ray.init(
        num_cpus=16,
        num_gpus=8,
        resources={"custom": 2.0},
        _memory=64 * GB,
        object_store_memory=100 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        (shape,) = read_cluster(ray)
        assert (shape.cpus, shape.gpus, shape.memory_bytes) == (16.0, 8.0, 64 * GB)
        assert cluster_nodes(None)[0] == (shape,)  # connected: that cluster, not this machine
        gpu = plan_run(released_config(), policy("cuda", "bf16"), 8, [shape])
        assert gpu.actors == 8 and gpu.num_gpus == 1.0
        cpu = plan_run(released_config(), policy("cpu", "fp32"), 8, [shape])
        assert_fits(cpu, [shape])
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_a_run_that_cannot_fit_is_refused_before_any_actor_starts(tiny_model_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-CPU node with 0.3 GB of Ray memory: one actor needs more; run_ray says so with the figures."""
    import ray

    from cosyclone.manifest import ManifestRow
    from cosyclone.options import RunOptions
    from cosyclone.ray import pool as ray_pool
    from cosyclone.ray.cluster import read_cluster
    from cosyclone.ray.pool import run_ray

    # actors are started by ray_pool.ActorPool: building one would mean actors could start
    monkeypatch.setattr(ray_pool, "ActorPool", lambda *a, **k: pytest.fail("an actor pool was built"))
    ray.init(num_cpus=2, _memory=int(0.3 * GB), object_store_memory=100 * 2**20, include_dashboard=False,
             log_to_driver=False)
    try:
        (shape,) = read_cluster(ray)
        assert (shape.cpus, shape.gpus, shape.memory_bytes) == (2.0, 0.0, int(0.3 * GB))
        seen: list[RayPlan] = []
        row = ManifestRow(id="r", prompt_audio=Path("p.wav"), prompt_text="a", text="b", line=1)
        with pytest.raises(
            CosycloneError, match=r"no node has room for one actor: it needs \d+\.\d GB"
        ) as err:
            # run_ray takes resolved options (resolve_options sets the batch size: 8 on CPU)
            list(
                run_ray(
                    load_model_config(tiny_model_dir),
                    policy("cpu", "fp32"),
                    RunOptions(batch_size=8),
                    [[row]],
                    on_plan=seen.append,
                )
            )
        assert "0.3 GB" in str(err.value)
        assert len(seen) == 1 and seen[0].actors == 0 and seen[0].refusal == str(err.value)
    finally:
        ray.shutdown()
