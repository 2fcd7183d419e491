"""Process plumbing of the orchestrator's commands: logs, the garbage collector's tuning, the
port a server listens on, threads run beside a block, and the first check of the connections."""
