"""What a job asks for (JobSpec, immutable, from a trace) and what happens to it (JobRun, engine-owned)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Final

GPU_MILLI: Final = 1000  # one whole GPU, in thousandths; fractional (GPU-sharing) jobs ask for less
# The largest time (submit, duration, overhead, interval) the model accepts, in seconds: about 317
# years, past any trace's epoch timestamps, and small enough that sums of times stay finite and
# exact to a microsecond. Larger values are input errors, not schedules.
MAX_TIME_S: Final = 1e10
# The largest count (GPUs, CPU milli, MiB) a job may ask for: beyond it int64 arithmetic is at risk.
MAX_COUNT: Final = 10**12


def by_fields(record: object) -> tuple:
    """``__reduce__`` of a frozen record: rebuilt by its constructor from its fields (those it
    takes; the others it derives again). (Compiled by mypyc, a frozen dataclass cannot be
    unpickled attribute by attribute, which Ray and process pools do to the traces and specs they
    send.)"""
    return type(record), tuple(getattr(record, f.name) for f in fields(record) if f.init)  # type: ignore[arg-type]


# Every request a JobSpec has made, each as one tuple object (JobSpec.request): the jobs of one
# shape share it, so that a memo keyed by it finds its key by identity, not item by item.
_REQUESTS: dict[tuple, tuple] = {}


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job of a trace, in the canonical form every reader converts to.

    ``num_gpus`` whole GPUs, each used at ``gpu_milli``/1000. A GPU-sharing job has
    ``num_gpus == 1`` and ``gpu_milli < 1000``; a CPU-only job has ``num_gpus == 0``.
    ``duration_s`` is the run time on an ideal placement (None: unknown, inflate mode only).
    ``gpu_models`` restricts placement to these GPU models (empty: any).
    """

    job_id: str  # unique in a trace
    submit_s: float  # when it is submitted, seconds on the trace's clock (0 <= submit_s <= MAX_TIME_S)
    duration_s: float | None  # (above) seconds; None: unknown
    num_gpus: int  # whole GPUs (above)
    gpu_milli: int = GPU_MILLI  # thousandths of each GPU it uses (above)
    cpu_milli: int = 0  # CPU, in thousandths of a core, over the whole job
    memory_mib: int = 0  # memory, in MiB, over the whole job
    vc: str = "default"  # its tenant: a VC of the cluster, or a LocalQueue under a partition
    user: str = ""  # who submitted it ("": unknown; per-user policies then use its VC)
    gpu_models: tuple[str, ...] = ()  # (above)
    qos: str = ""  # its priority class under a partition (partition.Partition.priorities); "": none
    # ``request``, made when first asked for (derived: not a constructor argument, not compared;
    # (): not yet. A trace's every spec is made before a run takes the ones it runs.)
    _request: tuple = field(default=(), init=False, repr=False, compare=False)

    @property
    def is_fractional(self) -> bool:
        return self.num_gpus == 1 and self.gpu_milli < GPU_MILLI

    @property
    def gpu_demand(self) -> float:
        """GPUs asked for, fractional jobs counting their share."""
        return self.num_gpus * self.gpu_milli / GPU_MILLI

    @property
    def request(self) -> tuple:
        """Everything of the job that placement reads, besides its VC: jobs with the same request
        and VC fit, or fail to, in the same places (a key for the engine's per-shape lists and
        the plugins' memos); one object per request (above)."""
        r = self._request
        if not r:
            r = (self.gpu_models, self.is_fractional, self.num_gpus, self.gpu_milli, self.cpu_milli, self.memory_mib)
            r = _REQUESTS.setdefault(r, r)
            object.__setattr__(self, "_request", r)
        return r

    def __reduce__(self) -> tuple:
        return by_fields(self)


# JobSpec's fields as its constructor takes them (a trace's columns, a journal's keys).
SPEC_FIELDS: Final = tuple(f.name for f in fields(JobSpec) if f.init)


class JobStatus(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(slots=True)
class Placement:
    """Where a running job sits: per node, the GPU indexes it holds.

    Invariant: ``nodes`` is the nodes of ``gpus`` in the same order (set from it on creation)."""

    gpus: tuple[tuple[int, tuple[int, ...]], ...]  # ((node, (gpu, ...)), ...)
    slowdown: float = 1.0  # >1 when spread over more nodes or racks than needed
    nodes: tuple[int, ...] = ()  # derived from gpus

    def __post_init__(self) -> None:
        self.nodes = tuple(n for n, _ in self.gpus)


@dataclass(slots=True)
class JobRun:
    """The engine's runtime record of a job.

    Invariant: ``placement`` is set while ``status`` is RUNNING and None otherwise; ``end_s`` is
    set once the job has ended (completed, failed or cancelled); ``remaining_s`` and
    ``attained_gpu_s`` are as of ``last_start_s`` while it runs (``remaining_at``, ``attained_at``
    give them at a later time)."""

    spec: JobSpec  # what was asked (never changed)
    seq: int  # arrival order: ties are broken by it, so runs are deterministic
    status: JobStatus = JobStatus.PENDING  # where it is in its life (the engine sets it)
    remaining_s: float = 0.0  # work left, in seconds at slowdown 1
    overhead_s: float = 0.0  # restore/migration time to pay before progress resumes
    attained_gpu_s: float = 0.0  # GPU-seconds received so far (Tiresias' 2D LAS)
    executed_s: float = 0.0  # wall (virtual) seconds spent running
    placement: Placement | None = None  # where it runs (see the invariant)
    last_start_s: float = 0.0  # start of the current run segment
    first_start_s: float | None = None  # when it first started, seconds (None: never yet)
    end_s: float | None = None  # when it completed, failed or was cancelled, seconds (None: not ended)
    enqueued_s: float = 0.0  # when it last entered the queue
    preemptions: int = 0  # times it was preempted (checkpointed and put back in the queue)
    migrations: int = 0  # times it was moved while running
    restarts: int = 0  # requeues after node failure
    queue_level: int = 0  # used by multi-level queue policies
    estimate_s: float | None = None  # predicted duration, for predicting policies
    completion_token: int = 0  # invalidates stale completion events after preemption
    placements_seen: list[tuple[int, ...]] = field(default_factory=list)  # each launch's nodes, in order

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def placed(self) -> Placement:
        """A running job's placement: ``placement``, without the None of a job not running."""
        if self.placement is None:
            raise ValueError(f"job {self.spec.job_id!r} is not placed")
        return self.placement

    def remaining_at(self, now: float) -> float:
        """A running job's work left at ``now``, counting the progress of its current segment (the
        overhead it pays first makes none)."""
        return max(0.0, self.remaining_s - max(0.0, (now - self.last_start_s) - self.overhead_s) / self.placed.slowdown)

    def attained_at(self, now: float) -> float:
        """A running job's GPU-seconds at ``now``, counting its current segment."""
        return self.attained_gpu_s + (now - self.last_start_s) * self.spec.gpu_demand
