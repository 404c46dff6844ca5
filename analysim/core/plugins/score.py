"""Score plugins: where a job goes. Ties always go to the lowest node index (determinism)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from analysim.core.job import GPU_MILLI, JobRun

if TYPE_CHECKING:
    from analysim.core.framework import Handle


def _free_after(job: JobRun, nodes: np.ndarray, ctx: Handle) -> np.ndarray:
    """Free GPU capacity (in GPUs, shares included) each node would have left after the job."""
    return ctx.state.free_total[nodes] / GPU_MILLI - job.spec.gpu_demand


class _Score:
    name: ClassVar[str] = ""

    def score(self, job: JobRun, nodes: np.ndarray, ctx: Handle) -> np.ndarray:
        raise NotImplementedError

    def choose(self, job: JobRun, feasible: np.ndarray, ctx: Handle) -> tuple[int, tuple[int, ...]] | None:
        return None


class BestFit(_Score):
    """Consolidate: the node left with the least free GPU capacity, keeping big holes for big jobs."""

    name: ClassVar[str] = "consolidate"

    def score(self, job: JobRun, nodes: np.ndarray, ctx: Handle) -> np.ndarray:
        return -_free_after(job, nodes, ctx)


class Spread(_Score):
    """Worst fit: the emptiest node, spreading load (and interference) out."""

    name: ClassVar[str] = "spread"

    def score(self, job: JobRun, nodes: np.ndarray, ctx: Handle) -> np.ndarray:
        return _free_after(job, nodes, ctx)


class RandomFit(_Score):
    """A uniformly random feasible node, from the run's seeded generator."""

    name: ClassVar[str] = "random"

    def score(self, job: JobRun, nodes: np.ndarray, ctx: Handle) -> np.ndarray:
        return ctx.rng.random(len(nodes))


class FragmentationGradientDescent(_Score):
    """FGD (Weng et al., ATC'23): the placement whose expected fragmentation, under the workload's
    distribution of task sizes, grows least."""

    name: ClassVar[str] = "fgd"

    def choose(self, job: JobRun, feasible: np.ndarray, ctx: Handle) -> tuple[int, tuple[int, ...]] | None:
        from analysim.core.fragmentation import fgd_choose

        return fgd_choose(ctx.fragmentation_index(), ctx.state, job.spec, feasible)

    def score(self, job: JobRun, nodes: np.ndarray, ctx: Handle) -> np.ndarray:
        return -_free_after(job, nodes, ctx)  # only reached if choose() declines: best fit


SCORES: dict[str, type[_Score]] = {
    cls.name: cls for cls in (BestFit, Spread, RandomFit, FragmentationGradientDescent)
}
SCORE_ALIASES = {"bestfit": "consolidate", "best-fit": "consolidate", "worstfit": "spread"}
