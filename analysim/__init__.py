"""AnalySIM: a trace-driven emulator for multi-tenant GPU clusters, and an MLaaS extraction monitor."""

import os

__version__ = "0.1.0"

# grpcio >= 1.80 restarts its poller in a forked child, where subprocess's close_fds has just
# closed the poller's epoll fd: the child aborts before exec (grpc/grpc#43055; measured here: 19 of
# 300 Popen calls beside a busy channel, 0 with this set). Our processes start children (up, the
# launcher, sweeps, the stack) but never use gRPC across a fork, so fork support stays off. It is
# read when grpc is imported, hence here, before any of our modules imports it; children inherit it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
