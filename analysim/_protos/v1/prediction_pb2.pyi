import datetime

from google.protobuf import any_pb2 as _any_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FeatureKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FEATURE_KIND_UNSPECIFIED: _ClassVar[FeatureKind]
    FEATURE_KIND_NUMERIC: _ClassVar[FeatureKind]
    FEATURE_KIND_CATEGORICAL: _ClassVar[FeatureKind]
FEATURE_KIND_UNSPECIFIED: FeatureKind
FEATURE_KIND_NUMERIC: FeatureKind
FEATURE_KIND_CATEGORICAL: FeatureKind

class Value(_message.Message):
    __slots__ = ("number", "text")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    number: float
    text: str
    def __init__(self, number: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("values", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    fields: _containers.MessageMap[str, Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., fields: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FeatureInfo(_message.Message):
    __slots__ = ("name", "kind", "min", "max", "categories")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: FeatureKind
    min: float
    max: float
    categories: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[FeatureKind, str]] = ..., min: _Optional[float] = ..., max: _Optional[float] = ..., categories: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("id", "features", "classes", "card")
    ID_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    CARD_FIELD_NUMBER: _ClassVar[int]
    id: str
    features: _containers.RepeatedCompositeFieldContainer[FeatureInfo]
    classes: _containers.RepeatedScalarFieldContainer[str]
    card: _struct_pb2.Struct
    def __init__(self, id: _Optional[str] = ..., features: _Optional[_Iterable[_Union[FeatureInfo, _Mapping]]] = ..., classes: _Optional[_Iterable[str]] = ..., card: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("model_id",)
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    def __init__(self, model_id: _Optional[str] = ...) -> None: ...

class GetModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: ModelInfo
    def __init__(self, model: _Optional[_Union[ModelInfo, _Mapping]] = ...) -> None: ...

class PackedRows(_message.Message):
    __slots__ = ("n_rows", "numbers", "categories")
    N_ROWS_FIELD_NUMBER: _ClassVar[int]
    NUMBERS_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    n_rows: int
    numbers: _containers.RepeatedScalarFieldContainer[float]
    categories: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, n_rows: _Optional[int] = ..., numbers: _Optional[_Iterable[float]] = ..., categories: _Optional[_Iterable[str]] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("model_id", "rows", "packed")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    packed: PackedRows
    def __init__(self, model_id: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., packed: _Optional[_Union[PackedRows, _Mapping]] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("label", "confidence", "leaf", "top")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    label: str
    confidence: float
    leaf: int
    top: _containers.RepeatedCompositeFieldContainer[ClassConfidence]
    def __init__(self, label: _Optional[str] = ..., confidence: _Optional[float] = ..., leaf: _Optional[int] = ..., top: _Optional[_Iterable[_Union[ClassConfidence, _Mapping]]] = ...) -> None: ...

class ClassConfidence(_message.Message):
    __slots__ = ("label", "confidence")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    label: str
    confidence: float
    def __init__(self, label: _Optional[str] = ..., confidence: _Optional[float] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("predictions", "query_id", "charged")
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    CHARGED_FIELD_NUMBER: _ClassVar[int]
    predictions: _containers.RepeatedCompositeFieldContainer[Prediction]
    query_id: int
    charged: float
    def __init__(self, predictions: _Optional[_Iterable[_Union[Prediction, _Mapping]]] = ..., query_id: _Optional[int] = ..., charged: _Optional[float] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: str
    def __init__(self, user: _Optional[str] = ...) -> None: ...

class ModelUsage(_message.Message):
    __slots__ = ("model_id", "queries", "rows", "charged")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CHARGED_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    queries: int
    rows: int
    charged: float
    def __init__(self, model_id: _Optional[str] = ..., queries: _Optional[int] = ..., rows: _Optional[int] = ..., charged: _Optional[float] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("user", "models", "queries", "rows", "charged")
    USER_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CHARGED_FIELD_NUMBER: _ClassVar[int]
    user: str
    models: _containers.RepeatedCompositeFieldContainer[ModelUsage]
    queries: int
    rows: int
    charged: float
    def __init__(self, user: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelUsage, _Mapping]]] = ..., queries: _Optional[int] = ..., rows: _Optional[int] = ..., charged: _Optional[float] = ...) -> None: ...

class PredictStreamRequest(_message.Message):
    __slots__ = ("request", "idempotency_key")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    request: PredictRequest
    idempotency_key: str
    def __init__(self, request: _Optional[_Union[PredictRequest, _Mapping]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class ErrorStatus(_message.Message):
    __slots__ = ("code", "message", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    details: _containers.RepeatedCompositeFieldContainer[_any_pb2.Any]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., details: _Optional[_Iterable[_Union[_any_pb2.Any, _Mapping]]] = ...) -> None: ...

class PredictStreamResponse(_message.Message):
    __slots__ = ("answer", "error", "replayed")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    answer: PredictResponse
    error: ErrorStatus
    replayed: bool
    def __init__(self, answer: _Optional[_Union[PredictResponse, _Mapping]] = ..., error: _Optional[_Union[ErrorStatus, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("after_seq", "model_id")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    model_id: str
    def __init__(self, after_seq: _Optional[int] = ..., model_id: _Optional[str] = ...) -> None: ...

class QueryEvent(_message.Message):
    __slots__ = ("seq", "timestamp", "user", "model_id", "n_features", "features", "labels", "confidences", "leaves")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    N_FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCES_FIELD_NUMBER: _ClassVar[int]
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    timestamp: _timestamp_pb2.Timestamp
    user: str
    model_id: str
    n_features: int
    features: _containers.RepeatedScalarFieldContainer[float]
    labels: _containers.RepeatedScalarFieldContainer[int]
    confidences: _containers.RepeatedScalarFieldContainer[float]
    leaves: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seq: _Optional[int] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., user: _Optional[str] = ..., model_id: _Optional[str] = ..., n_features: _Optional[int] = ..., features: _Optional[_Iterable[float]] = ..., labels: _Optional[_Iterable[int]] = ..., confidences: _Optional[_Iterable[float]] = ..., leaves: _Optional[_Iterable[int]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: QueryEvent
    def __init__(self, event: _Optional[_Union[QueryEvent, _Mapping]] = ...) -> None: ...
