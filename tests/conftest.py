"""Test-session set-up that must run before any test module imports grpc."""

import analysim  # noqa: F401  (sets GRPC_ENABLE_FORK_SUPPORT=false before grpc is imported; see there)
