import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GpuHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_HEALTH_UNSPECIFIED: _ClassVar[GpuHealth]
    GPU_HEALTH_OK: _ClassVar[GpuHealth]
    GPU_HEALTH_DEGRADED: _ClassVar[GpuHealth]
    GPU_HEALTH_FAILED: _ClassVar[GpuHealth]
GPU_HEALTH_UNSPECIFIED: GpuHealth
GPU_HEALTH_OK: GpuHealth
GPU_HEALTH_DEGRADED: GpuHealth
GPU_HEALTH_FAILED: GpuHealth

class NodeInfo(_message.Message):
    __slots__ = ("name", "rack", "gpu_model", "gpus", "cpu_milli", "memory_mib")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    name: str
    rack: str
    gpu_model: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    def __init__(self, name: _Optional[str] = ..., rack: _Optional[str] = ..., gpu_model: _Optional[str] = ..., gpus: _Optional[int] = ..., cpu_milli: _Optional[int] = ..., memory_mib: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("agent_id", "nodes", "running")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    running: _containers.RepeatedCompositeFieldContainer[RunningJob]
    def __init__(self, agent_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[RunningJob, _Mapping]]] = ...) -> None: ...

class RunningJob(_message.Message):
    __slots__ = ("launch", "start_s", "end_s", "failed")
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    launch: Launch
    start_s: float
    end_s: float
    failed: bool
    def __init__(self, launch: _Optional[_Union[Launch, _Mapping]] = ..., start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., failed: _Optional[bool] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("session_id", "clock", "heartbeat_interval")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    clock: ClockUpdate
    heartbeat_interval: _duration_pb2.Duration
    def __init__(self, session_id: _Optional[str] = ..., clock: _Optional[_Union[ClockUpdate, _Mapping]] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GpuState(_message.Message):
    __slots__ = ("index", "utilization", "memory_used_bytes", "memory_total_bytes", "power_watts", "temperature_celsius", "health", "job_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_CELSIUS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    utilization: float
    memory_used_bytes: float
    memory_total_bytes: float
    power_watts: float
    temperature_celsius: float
    health: GpuHealth
    job_id: str
    def __init__(self, index: _Optional[int] = ..., utilization: _Optional[float] = ..., memory_used_bytes: _Optional[float] = ..., memory_total_bytes: _Optional[float] = ..., power_watts: _Optional[float] = ..., temperature_celsius: _Optional[float] = ..., health: _Optional[_Union[GpuHealth, str]] = ..., job_id: _Optional[str] = ...) -> None: ...

class NodeTelemetry(_message.Message):
    __slots__ = ("node", "gpus")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuState]
    def __init__(self, node: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuState, _Mapping]]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("virtual_time_s", "nodes")
    VIRTUAL_TIME_S_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    virtual_time_s: float
    nodes: _containers.RepeatedCompositeFieldContainer[NodeTelemetry]
    def __init__(self, virtual_time_s: _Optional[float] = ..., nodes: _Optional[_Iterable[_Union[NodeTelemetry, _Mapping]]] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("kind", "job_id", "launch_id", "time_s", "message")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[JobEvent.Kind]
        KIND_STARTED: _ClassVar[JobEvent.Kind]
        KIND_FINISHED: _ClassVar[JobEvent.Kind]
        KIND_FAILED: _ClassVar[JobEvent.Kind]
    KIND_UNSPECIFIED: JobEvent.Kind
    KIND_STARTED: JobEvent.Kind
    KIND_FINISHED: JobEvent.Kind
    KIND_FAILED: JobEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: JobEvent.Kind
    job_id: str
    launch_id: int
    time_s: float
    message: str
    def __init__(self, kind: _Optional[_Union[JobEvent.Kind, str]] = ..., job_id: _Optional[str] = ..., launch_id: _Optional[int] = ..., time_s: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("step", "time_s", "lookahead_s")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_S_FIELD_NUMBER: _ClassVar[int]
    step: int
    time_s: float
    lookahead_s: float
    def __init__(self, step: _Optional[int] = ..., time_s: _Optional[float] = ..., lookahead_s: _Optional[float] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ("session_id", "events", "heartbeat", "ack")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    heartbeat: Heartbeat
    ack: Ack
    def __init__(self, session_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class GpuSlots(_message.Message):
    __slots__ = ("node", "gpus")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ...) -> None: ...

class Launch(_message.Message):
    __slots__ = ("job_id", "launch_id", "slots", "gpu_milli", "remaining_s", "overhead_s", "slowdown", "end_s", "duration_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_S_FIELD_NUMBER: _ClassVar[int]
    SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    launch_id: int
    slots: _containers.RepeatedCompositeFieldContainer[GpuSlots]
    gpu_milli: int
    remaining_s: float
    overhead_s: float
    slowdown: float
    end_s: float
    duration_s: float
    def __init__(self, job_id: _Optional[str] = ..., launch_id: _Optional[int] = ..., slots: _Optional[_Iterable[_Union[GpuSlots, _Mapping]]] = ..., gpu_milli: _Optional[int] = ..., remaining_s: _Optional[float] = ..., overhead_s: _Optional[float] = ..., slowdown: _Optional[float] = ..., end_s: _Optional[float] = ..., duration_s: _Optional[float] = ...) -> None: ...

class Preempt(_message.Message):
    __slots__ = ("job_id", "checkpoint")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    checkpoint: bool
    def __init__(self, job_id: _Optional[str] = ..., checkpoint: _Optional[bool] = ...) -> None: ...

class Migrate(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: Launch
    def __init__(self, target: _Optional[_Union[Launch, _Mapping]] = ...) -> None: ...

class Kill(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("time_s", "launch", "preempt", "migrate", "kill")
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_FIELD_NUMBER: _ClassVar[int]
    MIGRATE_FIELD_NUMBER: _ClassVar[int]
    KILL_FIELD_NUMBER: _ClassVar[int]
    time_s: float
    launch: Launch
    preempt: Preempt
    migrate: Migrate
    kill: Kill
    def __init__(self, time_s: _Optional[float] = ..., launch: _Optional[_Union[Launch, _Mapping]] = ..., preempt: _Optional[_Union[Preempt, _Mapping]] = ..., migrate: _Optional[_Union[Migrate, _Mapping]] = ..., kill: _Optional[_Union[Kill, _Mapping]] = ...) -> None: ...

class ClockUpdate(_message.Message):
    __slots__ = ("time_s", "speed", "lockstep", "paused", "step", "durable_s")
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    LOCKSTEP_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DURABLE_S_FIELD_NUMBER: _ClassVar[int]
    time_s: float
    speed: float
    lockstep: bool
    paused: bool
    step: int
    durable_s: float
    def __init__(self, time_s: _Optional[float] = ..., speed: _Optional[float] = ..., lockstep: _Optional[bool] = ..., paused: _Optional[bool] = ..., step: _Optional[int] = ..., durable_s: _Optional[float] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("commands", "clock")
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[Command]
    clock: ClockUpdate
    def __init__(self, commands: _Optional[_Iterable[_Union[Command, _Mapping]]] = ..., clock: _Optional[_Union[ClockUpdate, _Mapping]] = ...) -> None: ...
