"""Small builders for engine tests: hand-made clusters and jobs."""

from __future__ import annotations

from analysim.core.cluster import ClusterSpec, NodeSpec, VCSpec
from analysim.core.engine import Engine, EngineConfig
from analysim.core.job import JobSpec
from analysim.core.metrics import MetricsRecorder
from analysim.core.policies import build_policy


def cluster(nodes: int, gpus: int, *, rack_size: int = 2, vcs: tuple[VCSpec, ...] = (), **kw) -> ClusterSpec:
    return ClusterSpec(
        name=f"{nodes}x{gpus}",
        nodes=tuple(NodeSpec(f"n{i}", f"r{i // rack_size}", "V100", gpus, 64000, 256000) for i in range(nodes)),
        vcs=vcs, **kw,
    )


def job(jid: str, submit: float, gpus: int, duration: float, **kw) -> JobSpec:
    return JobSpec(job_id=jid, submit_s=submit, duration_s=duration, num_gpus=gpus, **kw)


def run_engine(spec: ClusterSpec, jobs: list[JobSpec], policy: str = "fifo", placement: str = "consolidate", *,
               backfill: bool = False, queue_options: dict | None = None, **config) -> Engine:
    config.setdefault("restore_overhead_s", 5.0)
    config.setdefault("migration_overhead_s", 7.0)
    engine = Engine(spec, build_policy(policy, placement, backfill=backfill, queue_options=queue_options), EngineConfig(**config),
                    recorder=MetricsRecorder(sample_interval_s=1.0))
    for j in jobs:
        engine.submit(j)
    engine.run()
    return engine


def times(engine: Engine) -> dict[str, tuple[float | None, float | None]]:
    """job -> (first start, end)."""
    return {jid: (j.first_start_s, j.end_s) for jid, j in engine.jobs.items()}
