from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Permissions(_message.Message):
    __slots__ = ("network", "writable_roots", "readable_roots", "masked_dirs", "hidden_paths", "protected_paths", "tmp_dir")
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_ROOTS_FIELD_NUMBER: _ClassVar[int]
    READABLE_ROOTS_FIELD_NUMBER: _ClassVar[int]
    MASKED_DIRS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_PATHS_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_PATHS_FIELD_NUMBER: _ClassVar[int]
    TMP_DIR_FIELD_NUMBER: _ClassVar[int]
    network: bool
    writable_roots: _containers.RepeatedScalarFieldContainer[str]
    readable_roots: _containers.RepeatedScalarFieldContainer[str]
    masked_dirs: _containers.RepeatedScalarFieldContainer[str]
    hidden_paths: _containers.RepeatedScalarFieldContainer[str]
    protected_paths: _containers.RepeatedScalarFieldContainer[str]
    tmp_dir: str
    def __init__(self, network: _Optional[bool] = ..., writable_roots: _Optional[_Iterable[str]] = ..., readable_roots: _Optional[_Iterable[str]] = ..., masked_dirs: _Optional[_Iterable[str]] = ..., hidden_paths: _Optional[_Iterable[str]] = ..., protected_paths: _Optional[_Iterable[str]] = ..., tmp_dir: _Optional[str] = ...) -> None: ...

class Unsandboxed(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionDefault(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Execution(_message.Message):
    __slots__ = ("unsandboxed", "session_default", "permissions")
    UNSANDBOXED_FIELD_NUMBER: _ClassVar[int]
    SESSION_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    unsandboxed: Unsandboxed
    session_default: SessionDefault
    permissions: Permissions
    def __init__(self, unsandboxed: _Optional[_Union[Unsandboxed, _Mapping]] = ..., session_default: _Optional[_Union[SessionDefault, _Mapping]] = ..., permissions: _Optional[_Union[Permissions, _Mapping]] = ...) -> None: ...

class SessionContext(_message.Message):
    __slots__ = ("session_id", "labels", "sandbox")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    labels: _containers.ScalarMap[str, str]
    sandbox: Permissions
    def __init__(self, session_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., sandbox: _Optional[_Union[Permissions, _Mapping]] = ...) -> None: ...

class ExecTarget(_message.Message):
    __slots__ = ("program", "argv", "workdir", "identity", "file", "children_unseen", "file_problem")
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_UNSEEN_FIELD_NUMBER: _ClassVar[int]
    FILE_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    program: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    identity: FileIdentity
    file: FileInfo
    children_unseen: bool
    file_problem: str
    def __init__(self, program: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., identity: _Optional[_Union[FileIdentity, _Mapping]] = ..., file: _Optional[_Union[FileInfo, _Mapping]] = ..., children_unseen: _Optional[bool] = ..., file_problem: _Optional[str] = ...) -> None: ...

class FileIdentity(_message.Message):
    __slots__ = ("source", "device", "inode", "uid", "mode", "real_path", "root_dir_chain", "caller_can_modify", "pseudo_fs", "same_for_server")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    REAL_PATH_FIELD_NUMBER: _ClassVar[int]
    ROOT_DIR_CHAIN_FIELD_NUMBER: _ClassVar[int]
    CALLER_CAN_MODIFY_FIELD_NUMBER: _ClassVar[int]
    PSEUDO_FS_FIELD_NUMBER: _ClassVar[int]
    SAME_FOR_SERVER_FIELD_NUMBER: _ClassVar[int]
    source: str
    device: int
    inode: int
    uid: int
    mode: int
    real_path: str
    root_dir_chain: bool
    caller_can_modify: bool
    pseudo_fs: bool
    same_for_server: bool
    def __init__(self, source: _Optional[str] = ..., device: _Optional[int] = ..., inode: _Optional[int] = ..., uid: _Optional[int] = ..., mode: _Optional[int] = ..., real_path: _Optional[str] = ..., root_dir_chain: _Optional[bool] = ..., caller_can_modify: _Optional[bool] = ..., pseudo_fs: _Optional[bool] = ..., same_for_server: _Optional[bool] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("format", "elf_class", "machine", "linkage", "interpreter", "setuid", "setgid", "capabilities", "problem", "interpreter_info")
    class Format(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FORMAT_UNSPECIFIED: _ClassVar[FileInfo.Format]
        FORMAT_ELF: _ClassVar[FileInfo.Format]
        FORMAT_SCRIPT: _ClassVar[FileInfo.Format]
        FORMAT_OTHER: _ClassVar[FileInfo.Format]
    FORMAT_UNSPECIFIED: FileInfo.Format
    FORMAT_ELF: FileInfo.Format
    FORMAT_SCRIPT: FileInfo.Format
    FORMAT_OTHER: FileInfo.Format
    class Linkage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        LINKAGE_UNSPECIFIED: _ClassVar[FileInfo.Linkage]
        LINKAGE_STATIC: _ClassVar[FileInfo.Linkage]
        LINKAGE_DYNAMIC: _ClassVar[FileInfo.Linkage]
    LINKAGE_UNSPECIFIED: FileInfo.Linkage
    LINKAGE_STATIC: FileInfo.Linkage
    LINKAGE_DYNAMIC: FileInfo.Linkage
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    ELF_CLASS_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    LINKAGE_FIELD_NUMBER: _ClassVar[int]
    INTERPRETER_FIELD_NUMBER: _ClassVar[int]
    SETUID_FIELD_NUMBER: _ClassVar[int]
    SETGID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    INTERPRETER_INFO_FIELD_NUMBER: _ClassVar[int]
    format: FileInfo.Format
    elf_class: int
    machine: int
    linkage: FileInfo.Linkage
    interpreter: str
    setuid: bool
    setgid: bool
    capabilities: bool
    problem: str
    interpreter_info: FileInfo
    def __init__(self, format: _Optional[_Union[FileInfo.Format, str]] = ..., elf_class: _Optional[int] = ..., machine: _Optional[int] = ..., linkage: _Optional[_Union[FileInfo.Linkage, str]] = ..., interpreter: _Optional[str] = ..., setuid: _Optional[bool] = ..., setgid: _Optional[bool] = ..., capabilities: _Optional[bool] = ..., problem: _Optional[str] = ..., interpreter_info: _Optional[_Union[FileInfo, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Escalate(_message.Message):
    __slots__ = ("execution",)
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    execution: Execution
    def __init__(self, execution: _Optional[_Union[Execution, _Mapping]] = ...) -> None: ...

class Deny(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("run", "escalate", "deny", "rule_id", "decision_id", "reason", "approver", "note")
    RUN_FIELD_NUMBER: _ClassVar[int]
    ESCALATE_FIELD_NUMBER: _ClassVar[int]
    DENY_FIELD_NUMBER: _ClassVar[int]
    RULE_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    run: Run
    escalate: Escalate
    deny: Deny
    rule_id: str
    decision_id: str
    reason: str
    approver: str
    note: str
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., escalate: _Optional[_Union[Escalate, _Mapping]] = ..., deny: _Optional[_Union[Deny, _Mapping]] = ..., rule_id: _Optional[str] = ..., decision_id: _Optional[str] = ..., reason: _Optional[str] = ..., approver: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class DetermineActionRequest(_message.Message):
    __slots__ = ("session", "target", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    session: SessionContext
    target: ExecTarget
    env: _containers.ScalarMap[str, str]
    def __init__(self, session: _Optional[_Union[SessionContext, _Mapping]] = ..., target: _Optional[_Union[ExecTarget, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DetermineActionResponse(_message.Message):
    __slots__ = ("decision", "cache", "rules_fingerprint")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    RULES_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    cache: CacheHint
    rules_fingerprint: str
    def __init__(self, decision: _Optional[_Union[Decision, _Mapping]] = ..., cache: _Optional[_Union[CacheHint, _Mapping]] = ..., rules_fingerprint: _Optional[str] = ...) -> None: ...

class CacheHint(_message.Message):
    __slots__ = ("scope", "ttl_ms")
    class Scope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SCOPE_UNSPECIFIED: _ClassVar[CacheHint.Scope]
        SCOPE_PROGRAM: _ClassVar[CacheHint.Scope]
        SCOPE_EXACT: _ClassVar[CacheHint.Scope]
    SCOPE_UNSPECIFIED: CacheHint.Scope
    SCOPE_PROGRAM: CacheHint.Scope
    SCOPE_EXACT: CacheHint.Scope
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    scope: CacheHint.Scope
    ttl_ms: int
    def __init__(self, scope: _Optional[_Union[CacheHint.Scope, str]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class CachedDecision(_message.Message):
    __slots__ = ("session", "target", "decision", "cached_from", "time_unix_ms", "latency_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    CACHED_FROM_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    session: SessionContext
    target: ExecTarget
    decision: Decision
    cached_from: str
    time_unix_ms: int
    latency_ms: float
    def __init__(self, session: _Optional[_Union[SessionContext, _Mapping]] = ..., target: _Optional[_Union[ExecTarget, _Mapping]] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., cached_from: _Optional[str] = ..., time_unix_ms: _Optional[int] = ..., latency_ms: _Optional[float] = ...) -> None: ...

class RecordCachedDecisionsRequest(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[CachedDecision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[CachedDecision, _Mapping]]] = ...) -> None: ...

class RecordCachedDecisionsResponse(_message.Message):
    __slots__ = ("recorded", "rules_fingerprint")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    RULES_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    rules_fingerprint: str
    def __init__(self, recorded: _Optional[int] = ..., rules_fingerprint: _Optional[str] = ...) -> None: ...

class PrepareEscalatedExecRequest(_message.Message):
    __slots__ = ("session", "target", "env", "execution", "decision_id")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    session: SessionContext
    target: ExecTarget
    env: _containers.ScalarMap[str, str]
    execution: Execution
    decision_id: str
    def __init__(self, session: _Optional[_Union[SessionContext, _Mapping]] = ..., target: _Optional[_Union[ExecTarget, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., execution: _Optional[_Union[Execution, _Mapping]] = ..., decision_id: _Optional[str] = ...) -> None: ...

class PreparedExec(_message.Message):
    __slots__ = ("command", "cwd", "env", "arg0")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    ARG0_FIELD_NUMBER: _ClassVar[int]
    command: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    env: _containers.ScalarMap[str, str]
    arg0: str
    def __init__(self, command: _Optional[_Iterable[str]] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., arg0: _Optional[str] = ...) -> None: ...

class PrepareEscalatedExecResponse(_message.Message):
    __slots__ = ("prepared",)
    PREPARED_FIELD_NUMBER: _ClassVar[int]
    prepared: PreparedExec
    def __init__(self, prepared: _Optional[_Union[PreparedExec, _Mapping]] = ...) -> None: ...
