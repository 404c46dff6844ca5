import datetime

from analysim._protos.v1 import agent_pb2 as _agent_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATUS_UNSPECIFIED: _ClassVar[JobStatus]
    JOB_STATUS_PENDING: _ClassVar[JobStatus]
    JOB_STATUS_RUNNING: _ClassVar[JobStatus]
    JOB_STATUS_COMPLETED: _ClassVar[JobStatus]
    JOB_STATUS_FAILED: _ClassVar[JobStatus]
    JOB_STATUS_CANCELLED: _ClassVar[JobStatus]

class JobSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_SOURCE_UNSPECIFIED: _ClassVar[JobSource]
    JOB_SOURCE_TRACE: _ClassVar[JobSource]
    JOB_SOURCE_CLIENT: _ClassVar[JobSource]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_WATCHING: _ClassVar[EventKind]
    EVENT_KIND_SUBMIT: _ClassVar[EventKind]
    EVENT_KIND_LAUNCH: _ClassVar[EventKind]
    EVENT_KIND_PREEMPT: _ClassVar[EventKind]
    EVENT_KIND_MIGRATE: _ClassVar[EventKind]
    EVENT_KIND_COMPLETE: _ClassVar[EventKind]
    EVENT_KIND_REQUEUE: _ClassVar[EventKind]
    EVENT_KIND_CANCEL: _ClassVar[EventKind]
    EVENT_KIND_FAIL: _ClassVar[EventKind]
    EVENT_KIND_RESUME: _ClassVar[EventKind]
    EVENT_KIND_NODE_DOWN: _ClassVar[EventKind]
    EVENT_KIND_NODE_UP: _ClassVar[EventKind]
    EVENT_KIND_DONE: _ClassVar[EventKind]
JOB_STATUS_UNSPECIFIED: JobStatus
JOB_STATUS_PENDING: JobStatus
JOB_STATUS_RUNNING: JobStatus
JOB_STATUS_COMPLETED: JobStatus
JOB_STATUS_FAILED: JobStatus
JOB_STATUS_CANCELLED: JobStatus
JOB_SOURCE_UNSPECIFIED: JobSource
JOB_SOURCE_TRACE: JobSource
JOB_SOURCE_CLIENT: JobSource
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_WATCHING: EventKind
EVENT_KIND_SUBMIT: EventKind
EVENT_KIND_LAUNCH: EventKind
EVENT_KIND_PREEMPT: EventKind
EVENT_KIND_MIGRATE: EventKind
EVENT_KIND_COMPLETE: EventKind
EVENT_KIND_REQUEUE: EventKind
EVENT_KIND_CANCEL: EventKind
EVENT_KIND_FAIL: EventKind
EVENT_KIND_RESUME: EventKind
EVENT_KIND_NODE_DOWN: EventKind
EVENT_KIND_NODE_UP: EventKind
EVENT_KIND_DONE: EventKind

class Job(_message.Message):
    __slots__ = ("job_id", "status", "vc", "user", "num_gpus", "gpu_milli", "duration_s", "submit_s", "first_start_s", "end_s", "nodes", "preemptions", "migrations", "restarts", "source")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VC_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    status: JobStatus
    vc: str
    user: str
    num_gpus: int
    gpu_milli: int
    duration_s: float
    submit_s: float
    first_start_s: float
    end_s: float
    nodes: _containers.RepeatedScalarFieldContainer[str]
    preemptions: int
    migrations: int
    restarts: int
    source: JobSource
    def __init__(self, job_id: _Optional[str] = ..., status: _Optional[_Union[JobStatus, str]] = ..., vc: _Optional[str] = ..., user: _Optional[str] = ..., num_gpus: _Optional[int] = ..., gpu_milli: _Optional[int] = ..., duration_s: _Optional[float] = ..., submit_s: _Optional[float] = ..., first_start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., nodes: _Optional[_Iterable[str]] = ..., preemptions: _Optional[int] = ..., migrations: _Optional[int] = ..., restarts: _Optional[int] = ..., source: _Optional[_Union[JobSource, str]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("job_id", "num_gpus", "gpu_milli", "duration_s", "vc", "user", "gpu_models", "cpu_milli", "memory_mib")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    VC_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    GPU_MODELS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    num_gpus: int
    gpu_milli: int
    duration_s: float
    vc: str
    user: str
    gpu_models: _containers.RepeatedScalarFieldContainer[str]
    cpu_milli: int
    memory_mib: int
    def __init__(self, job_id: _Optional[str] = ..., num_gpus: _Optional[int] = ..., gpu_milli: _Optional[int] = ..., duration_s: _Optional[float] = ..., vc: _Optional[str] = ..., user: _Optional[str] = ..., gpu_models: _Optional[_Iterable[str]] = ..., cpu_milli: _Optional[int] = ..., memory_mib: _Optional[int] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("status", "vc", "limit", "offset")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VC_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    status: JobStatus
    vc: str
    limit: int
    offset: int
    def __init__(self, status: _Optional[_Union[JobStatus, str]] = ..., vc: _Optional[str] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "total")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    total: int
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("kinds",)
    KINDS_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[EventKind]
    def __init__(self, kinds: _Optional[_Iterable[_Union[EventKind, str]]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("time_s", "kind", "job_id", "nodes", "message")
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    time_s: float
    kind: EventKind
    job_id: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    message: str
    def __init__(self, time_s: _Optional[float] = ..., kind: _Optional[_Union[EventKind, str]] = ..., job_id: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: Event
    def __init__(self, event: _Optional[_Union[Event, _Mapping]] = ...) -> None: ...

class ClockState(_message.Message):
    __slots__ = ("time_s", "speed", "lockstep", "paused", "started", "wall_elapsed")
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    LOCKSTEP_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    WALL_ELAPSED_FIELD_NUMBER: _ClassVar[int]
    time_s: float
    speed: float
    lockstep: bool
    paused: bool
    started: bool
    wall_elapsed: _duration_pb2.Duration
    def __init__(self, time_s: _Optional[float] = ..., speed: _Optional[float] = ..., lockstep: _Optional[bool] = ..., paused: _Optional[bool] = ..., started: _Optional[bool] = ..., wall_elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "allocated", "telemetry")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    index: int
    allocated: float
    telemetry: _agent_pb2.GpuState
    def __init__(self, index: _Optional[int] = ..., allocated: _Optional[float] = ..., telemetry: _Optional[_Union[_agent_pb2.GpuState, _Mapping]] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("name", "rack", "gpu_model", "gpus", "up", "agent_id", "free_gpus", "gpu")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    name: str
    rack: str
    gpu_model: str
    gpus: int
    up: bool
    agent_id: str
    free_gpus: float
    gpu: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    def __init__(self, name: _Optional[str] = ..., rack: _Optional[str] = ..., gpu_model: _Optional[str] = ..., gpus: _Optional[int] = ..., up: _Optional[bool] = ..., agent_id: _Optional[str] = ..., free_gpus: _Optional[float] = ..., gpu: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ...) -> None: ...

class GetClusterStateRequest(_message.Message):
    __slots__ = ("nodes", "queue_limit")
    NODES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    nodes: bool
    queue_limit: int
    def __init__(self, nodes: _Optional[bool] = ..., queue_limit: _Optional[int] = ...) -> None: ...

class ClusterState(_message.Message):
    __slots__ = ("clock", "gpus_total", "gpus_allocated", "nodes_up", "nodes_down", "jobs_submitted", "jobs_pending", "jobs_running", "jobs_completed", "jobs_failed", "jobs_cancelled", "pending_gpu_demand", "queue", "nodes", "agents", "replay_done", "trace_jobs", "policy")
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    NODES_UP_FIELD_NUMBER: _ClassVar[int]
    NODES_DOWN_FIELD_NUMBER: _ClassVar[int]
    JOBS_SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    JOBS_PENDING_FIELD_NUMBER: _ClassVar[int]
    JOBS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    JOBS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    JOBS_FAILED_FIELD_NUMBER: _ClassVar[int]
    JOBS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    PENDING_GPU_DEMAND_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    REPLAY_DONE_FIELD_NUMBER: _ClassVar[int]
    TRACE_JOBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    clock: ClockState
    gpus_total: int
    gpus_allocated: float
    nodes_up: int
    nodes_down: int
    jobs_submitted: int
    jobs_pending: int
    jobs_running: int
    jobs_completed: int
    jobs_failed: int
    jobs_cancelled: int
    pending_gpu_demand: float
    queue: _containers.RepeatedCompositeFieldContainer[Job]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    agents: int
    replay_done: bool
    trace_jobs: int
    policy: str
    def __init__(self, clock: _Optional[_Union[ClockState, _Mapping]] = ..., gpus_total: _Optional[int] = ..., gpus_allocated: _Optional[float] = ..., nodes_up: _Optional[int] = ..., nodes_down: _Optional[int] = ..., jobs_submitted: _Optional[int] = ..., jobs_pending: _Optional[int] = ..., jobs_running: _Optional[int] = ..., jobs_completed: _Optional[int] = ..., jobs_failed: _Optional[int] = ..., jobs_cancelled: _Optional[int] = ..., pending_gpu_demand: _Optional[float] = ..., queue: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., agents: _Optional[int] = ..., replay_done: _Optional[bool] = ..., trace_jobs: _Optional[int] = ..., policy: _Optional[str] = ...) -> None: ...

class GetClusterStateResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: ClusterState
    def __init__(self, state: _Optional[_Union[ClusterState, _Mapping]] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("clock",)
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    clock: ClockState
    def __init__(self, clock: _Optional[_Union[ClockState, _Mapping]] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("clock",)
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    clock: ClockState
    def __init__(self, clock: _Optional[_Union[ClockState, _Mapping]] = ...) -> None: ...

class SetSpeedRequest(_message.Message):
    __slots__ = ("speed", "max")
    SPEED_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    speed: float
    max: bool
    def __init__(self, speed: _Optional[float] = ..., max: _Optional[bool] = ...) -> None: ...

class SetSpeedResponse(_message.Message):
    __slots__ = ("clock",)
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    clock: ClockState
    def __init__(self, clock: _Optional[_Union[ClockState, _Mapping]] = ...) -> None: ...

class GetSummaryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSummaryResponse(_message.Message):
    __slots__ = ("done", "summary")
    DONE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    done: bool
    summary: _struct_pb2.Struct
    def __init__(self, done: _Optional[bool] = ..., summary: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ExplainJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ExplainJobResponse(_message.Message):
    __slots__ = ("status", "time_s", "reason", "detail", "queue")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    status: JobStatus
    time_s: float
    reason: str
    detail: str
    queue: str
    def __init__(self, status: _Optional[_Union[JobStatus, str]] = ..., time_s: _Optional[float] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., queue: _Optional[str] = ...) -> None: ...
