"""A synthetic trace shaped like Microsoft Philly, with no data file needed (the demo's default trace).

Every number below was fitted to ``../shared/traces/philly.csv`` (the Pollux artifact's Philly extract:
82,247 jobs submitted 2017-09-04 10:30:41 to 2017-12-22 08:02:11, 108.9 days, 15 virtual clusters) by
``bench/fit_philly.py`` on 2026-11-30; re-run it to refit. The model:

* Arrivals come in batches (jobs submitted in the same second: 93% of multi-job seconds are one VC,
  98% one GPU count, so mostly sweeps). Batches form a Poisson process whose rate is the extract's mean
  (755.27 jobs/day, which is what gives its ~374 busy GPUs on average) times a weekday weight, an
  hour-of-day weight and a per-day log-normal factor (mean 1) for the day-to-day burstiness. Weights
  and the factor's sigma are fitted over the 84 "busy" days (>= 100 jobs): the extract's first 20 days
  are a ramp-up and a few later days a logging gap. Day 0 is a Monday, like 2017-09-04, and hours are
  the trace's own clock (its time zone is not stated).
* A batch has one GPU count (drawn from the extract's per-job counts) and one VC (drawn from the
  extract's VC mix among jobs of that GPU-count class, so big-job VCs keep their GPU-time shares).
* Durations are drawn per job from the empirical quantile function of the job's GPU-count class
  (1, 2, 3-4, 5-15, 16+ GPUs), interpolated linearly in log(duration); the knots are dense in the tail
  so class means stay within 2% of the data's. Durations and submit times are whole seconds, as in
  the extract.
* Philly has no CPU or memory columns: each job asks for CPU_MILLI_PER_GPU and MEMORY_MIB_PER_GPU per
  GPU, 60% / 75% of a DGX-1's per-GPU share (80 vCPU, 512 GiB for 8 V100), so that GPUs stay the
  binding resource as they were in Philly.

``rate_scale`` multiplies the arrival rate only: 1.0 offers Philly's load (~374 busy GPUs on average,
for a cluster of ~512 GPUs); scale it by your cluster's GPUs / 512 to keep the same relative load.
"""

from __future__ import annotations

import numpy as np

from analysim.core.job import JobSpec
from analysim.errors import UserError
from analysim.traces.base import Trace, gc_paused

FORMAT = "synthetic"
DAY_S = 86400
CPU_MILLI_PER_GPU = 6000
MEMORY_MIB_PER_GPU = 48 * 1024

# --- fitted to philly.csv by bench/fit_philly.py -------------------------------------------------
MEAN_JOBS_PER_DAY = 755.27  # 82,247 jobs / 108.897 days
HOUR_WEIGHTS = (
    1.2725, 0.9838, 1.1137, 1.1035, 0.6992, 1.1523, 1.6733, 2.0928, 1.1117, 1.0066, 1.0236, 0.87,
    0.7507, 0.7062, 0.6386, 0.65, 0.8829, 0.6682, 0.8007, 0.7299, 1.016, 0.9145, 1.1304, 1.009,
)  # fmt: skip  # jobs per hour of day / mean, busy days
WEEKDAY_WEIGHTS = (0.8648, 0.99, 1.1388, 1.2927, 1.4492, 0.6662, 0.5984)  # Monday first, busy days
DAILY_LOG_SIGMA = 0.7469  # sd of log(jobs that day / weekday-adjusted mean), busy days
# Jobs submitted in the same second -> how many such seconds.
BATCH_SIZE_COUNTS = {
    1: 70198, 2: 4527, 3: 639, 4: 156, 5: 29, 6: 9, 7: 5, 8: 4, 9: 4, 10: 4, 11: 2, 12: 1, 13: 1,
    14: 1, 16: 2, 19: 1,
}  # fmt: skip
GPU_COUNT_JOBS = {1: 76627, 2: 1818, 4: 1870, 8: 1643, 12: 7, 16: 199, 24: 7, 32: 67, 64: 6, 128: 3}
VCS = (
    "6214e9", "11cb48", "6c71a0", "b436b2", "103959", "ee9e8c", "0e4a51", "ed69ec", "7f04ca",
    "2869ce", "e13805", "23dbec", "51b7ef", "795a4c", "925e2b",
)  # fmt: skip  # by job count, largest first
CLASS_BOUNDS = (1, 2, 4, 15)  # classes: 1 | 2 | 3-4 | 5-15 | 16+ GPUs
VC_JOBS_BY_CLASS = (  # jobs per VC (in VCS order), per GPU-count class
    (40841, 14607, 9054, 7237, 1571, 597, 1090, 1137, 204, 64, 215, 2, 4, 3, 1),
    (50, 1415, 37, 3, 33, 109, 164, 0, 0, 4, 3, 0, 0, 0, 0),
    (144, 40, 396, 72, 330, 266, 181, 0, 329, 10, 102, 0, 0, 0, 0),
    (191, 10, 455, 51, 0, 420, 0, 0, 179, 293, 43, 6, 0, 0, 2),
    (0, 19, 11, 60, 0, 119, 0, 0, 11, 51, 11, 0, 0, 0, 0),
)
QUANTILE_LEVELS = (
    0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75,
    0.8, 0.85, 0.9, 0.925, 0.95, 0.96, 0.97, 0.98, 0.985, 0.99, 0.9925, 0.995, 0.9975, 0.999, 0.9995,
    0.9999, 1.0,
)  # fmt: skip
DURATION_QUANTILES = (  # seconds, at QUANTILE_LEVELS, per GPU-count class (mean 8301 / 30942 / 78762 / 129230 / 97660 s)
    (1.0, 30.0, 42.0, 52.0, 62.0, 69.0, 76.0, 122.0, 215.0, 385.0, 600.0, 855.0, 1117.0, 1446.0, 1728.0,
     2054.0, 2464.2, 2716.0, 3754.0, 5342.1, 8512.0, 11166.1, 19137.0, 26415.8, 44232.7, 68251.7,
     93428.5, 135399.3, 176022.1, 266914.1, 430842.8, 865708.7, 1447516.6, 2618276.0, 3256045.0),
    (2.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0, 16.0, 17.0, 18.0, 19.0, 20.0, 21.0, 23.0, 25.0, 28.0, 33.0,
     76.0, 149.2, 22255.5, 72740.2, 124487.6, 197062.2, 232484.2, 267687.1, 343861.7, 428215.0,
     523316.1, 621108.3, 808063.9, 1264625.8, 1474215.4, 1618289.4, 2389900.3, 2582803.0),
    (3.0, 35.7, 45.0, 75.0, 137.8, 179.3, 404.8, 772.8, 1695.7, 4457.6, 7467.8, 13086.6, 17409.5,
     26251.2, 36288.2, 56846.0, 78660.0, 89394.2, 106283.8, 151447.7, 184435.3, 196484.2, 273968.2,
     357336.7, 449496.6, 533377.7, 654303.7, 907375.5, 1105898.4, 1205989.5, 1706752.8, 2446300.8,
     2648712.6, 2730281.7, 2750674.0),
    (1.0, 33.5, 67.9, 125.0, 216.9, 464.0, 766.2, 1737.0, 3828.7, 7052.2, 12135.8, 16356.4, 23622.5,
     36347.5, 64017.8, 104630.0, 138654.7, 172980.5, 202571.0, 242037.3, 350485.7, 407941.4, 525573.4,
     592080.4, 665947.1, 793178.2, 926147.5, 1059432.3, 1126076.4, 1998735.0, 2203361.4, 2656454.1,
     3004421.1, 4303465.0, 4628226.0),
    (1.0, 3.6, 4.0, 35.0, 69.4, 201.5, 345.0, 609.5, 925.8, 2203.2, 4372.4, 11999.3, 28465.5, 47062.2,
     54911.6, 62313.8, 78039.7, 109991.0, 160368.2, 184333.0, 251986.5, 334652.8, 445765.3, 496529.5,
     517749.1, 615236.5, 650246.1, 940904.9, 1124319.9, 1281793.0, 1471254.2, 1614887.5, 1662765.2,
     1701067.4, 1710643.0),
)  # fmt: skip
# --------------------------------------------------------------------------------------------------

_CHUNK_DAYS = 7  # generated a week at a time, so a longer trace extends a shorter one with the same seed


def _pmf(weights: tuple[float, ...] | list[int]) -> np.ndarray:
    w = np.asarray(weights, dtype=float)
    return w / w.sum()


_BATCH_SIZES = np.array(list(BATCH_SIZE_COUNTS))
_BATCH_P = _pmf(list(BATCH_SIZE_COUNTS.values()))
_BATCHES_PER_DAY = MEAN_JOBS_PER_DAY / float(_BATCH_SIZES @ _BATCH_P)
_HOUR_P = _pmf(HOUR_WEIGHTS)
_GPU_COUNTS = np.array(list(GPU_COUNT_JOBS))
_GPU_P = _pmf(list(GPU_COUNT_JOBS.values()))
_VC_P = [_pmf(row) for row in VC_JOBS_BY_CLASS]
_LEVELS = np.array(QUANTILE_LEVELS)
_LOG_Q = [np.log(np.array(q)) for q in DURATION_QUANTILES]


def gpu_class(num_gpus: np.ndarray) -> np.ndarray:
    """Index into the per-class tables of each GPU count."""
    return np.searchsorted(np.array(CLASS_BOUNDS), num_gpus, side="left")


def generate(jobs: int, seed: int, *, rate_scale: float = 1.0, limit: int | None = None) -> Trace:
    """``jobs`` Philly-like jobs; the same (seed, rate_scale) always gives the same trace. With
    ``limit``, only its first ``limit`` jobs (by submit time) are made."""
    if jobs < 0:
        raise UserError(f"number of jobs must be at least 0, got {jobs}")
    if not 1e-3 <= rate_scale <= 1e3:
        raise UserError(f"rate scale must be between 0.001 and 1000, got {rate_scale}")
    width = max(6, len(str(jobs - 1)))  # of the ids: those of the first jobs do not depend on limit
    source = f"synthetic Philly-like trace (jobs={jobs}, seed={seed}, rate_scale={rate_scale:g})"
    if limit is not None:
        jobs = min(jobs, limit)  # a longer trace extends a shorter one (same seed and rate scale)
    rng = np.random.Generator(np.random.PCG64(seed))
    chunks: list[tuple[np.ndarray, ...]] = []
    made, first_day = 0, 0
    while made < jobs:
        chunk = _week(rng, first_day, rate_scale)
        chunks.append(chunk)
        made += len(chunk[0])
        first_day += _CHUNK_DAYS
    if chunks:
        submit, gpus, vc, duration = (np.concatenate(c)[:jobs] for c in zip(*chunks, strict=True))
    else:
        submit = duration = np.zeros(0)
        gpus = vc = np.zeros(0, dtype=int)
    with gc_paused():
        out = [
            JobSpec(
                job_id=f"syn-{i:0{width}d}",
                submit_s=s,
                duration_s=d,
                num_gpus=g,
                cpu_milli=g * CPU_MILLI_PER_GPU,
                memory_mib=g * MEMORY_MIB_PER_GPU,
                vc=VCS[v],
            )
            for i, (s, d, g, v) in enumerate(
                zip(submit.tolist(), duration.tolist(), gpus.tolist(), vc.tolist(), strict=True)
            )
        ]
    return Trace(out, source, FORMAT, {})


def _week(rng: np.random.Generator, first_day: int, rate_scale: float) -> tuple[np.ndarray, ...]:
    """One chunk of days: (submit_s, num_gpus, vc index, duration_s) per job, in submit order."""
    days = np.arange(first_day, first_day + _CHUNK_DAYS)
    factor = rng.lognormal(-(DAILY_LOG_SIGMA**2) / 2, DAILY_LOG_SIGMA, size=days.size)  # mean 1
    expected = _BATCHES_PER_DAY * rate_scale * np.asarray(WEEKDAY_WEIGHTS)[days % 7] * factor
    per_day = rng.poisson(expected)
    n = int(per_day.sum())
    hour = rng.choice(24, size=n, p=_HOUR_P)
    t = np.repeat(days, per_day) * DAY_S + hour * 3600 + rng.integers(0, 3600, size=n)
    order = np.argsort(t, kind="stable")
    t = t[order]
    size = rng.choice(_BATCH_SIZES, size=n, p=_BATCH_P)
    gpus = rng.choice(_GPU_COUNTS, size=n, p=_GPU_P)
    cls = gpu_class(gpus)
    vc = np.empty(n, dtype=np.int64)
    for c, p in enumerate(_VC_P):
        m = cls == c
        vc[m] = rng.choice(len(VCS), size=int(m.sum()), p=p)
    # Expand batches into jobs; each job draws its own duration.
    submit = np.repeat(t, size).astype(float)
    gpus, cls, vc = np.repeat(gpus, size), np.repeat(cls, size), np.repeat(vc, size)
    u = rng.random(submit.size)
    log_d = np.empty(submit.size)
    for c, log_q in enumerate(_LOG_Q):
        m = cls == c
        log_d[m] = np.interp(u[m], _LEVELS, log_q)
    duration = np.maximum(np.rint(np.exp(log_d)), 1.0)
    return submit, gpus, vc, duration
