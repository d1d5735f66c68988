"""ctypes binding of libpegaflow (the C client of the PegaFlow Engine API).

Nothing is loaded at import: the library is opened on first use (load_library)."""

from pegaflow.client._lib import LibraryError, load_library
from pegaflow.client.engine import (
    TRANSFER_MODE_DIRECT,
    TRANSFER_MODE_KERNEL,
    EngineClient,
    LayerRegistration,
    LeaseLoad,
    QueryResult,
    RegisterArgs,
    SaveLayer,
    Session,
    ipc_cuda,
    ipc_sim,
)
from pegaflow.client.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    PegaflowError,
    Unavailable,
    Unimplemented,
    VersionMismatch,
)
from pegaflow.client.loadstate import CLoadState, ShmLoadState, create_load_state

__all__ = [
    "CLoadState", "DeadlineExceeded", "EngineClient", "FailedPrecondition", "Internal",
    "InvalidArgument", "LayerRegistration", "LeaseLoad", "LibraryError", "PegaflowError",
    "QueryResult", "RegisterArgs", "SaveLayer", "Session", "ShmLoadState",
    "TRANSFER_MODE_DIRECT", "TRANSFER_MODE_KERNEL", "Unavailable", "Unimplemented",
    "VersionMismatch", "create_load_state", "ipc_cuda", "ipc_sim", "load_library",
]
