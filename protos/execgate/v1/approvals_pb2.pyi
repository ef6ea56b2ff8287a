from execgate.v1 import policy_pb2 as _policy_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_APPROVE_ONCE: _ClassVar[Verdict]
    VERDICT_APPROVE_FOR_SESSION: _ClassVar[Verdict]
    VERDICT_DENY: _ClassVar[Verdict]
VERDICT_UNSPECIFIED: Verdict
VERDICT_APPROVE_ONCE: Verdict
VERDICT_APPROVE_FOR_SESSION: Verdict
VERDICT_DENY: Verdict

class PendingApproval(_message.Message):
    __slots__ = ("request_id", "session", "target", "rule_id", "reason", "execution", "seconds_left", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    RULE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_LEFT_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session: _policy_pb2.SessionContext
    target: _policy_pb2.ExecTarget
    rule_id: str
    reason: str
    execution: _policy_pb2.Execution
    seconds_left: float
    env: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., session: _Optional[_Union[_policy_pb2.SessionContext, _Mapping]] = ..., target: _Optional[_Union[_policy_pb2.ExecTarget, _Mapping]] = ..., rule_id: _Optional[str] = ..., reason: _Optional[str] = ..., execution: _Optional[_Union[_policy_pb2.Execution, _Mapping]] = ..., seconds_left: _Optional[float] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WatchPendingRequest(_message.Message):
    __slots__ = ("approver",)
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    approver: str
    def __init__(self, approver: _Optional[str] = ...) -> None: ...

class ResolveApprovalRequest(_message.Message):
    __slots__ = ("request_id", "verdict", "reason", "approver")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    verdict: Verdict
    reason: str
    approver: str
    def __init__(self, request_id: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., reason: _Optional[str] = ..., approver: _Optional[str] = ...) -> None: ...

class ResolveApprovalResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPendingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPendingResponse(_message.Message):
    __slots__ = ("pending",)
    PENDING_FIELD_NUMBER: _ClassVar[int]
    pending: _containers.RepeatedCompositeFieldContainer[PendingApproval]
    def __init__(self, pending: _Optional[_Iterable[_Union[PendingApproval, _Mapping]]] = ...) -> None: ...
