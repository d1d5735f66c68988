"""Package version. It is not the wire version: RegisterContextBatch sends the C library's
pf_client_version(), which must equal `pegaflow-server --version`."""

__version__ = "0.23.12"
