"""The ZeroMQ control transport: trio sockets and the daemon's async client."""
