"""Shell sessions that stay for the run (the ``bash_session`` tool).

Each session is a shell under a pseudo-terminal, started in the run's box (its uid, namespaces
and control groups, as run_bash's commands) by a holder process of its own, which owns the
terminal and lives until the run ends, the session idles past ``TOOLQ_SESSION_IDLE_S``, or the
worker that started it dies. The worker's processes reach a holder through a unix socket in a
folder of the worker's own (0700), which no run can reach.

The parts: ``wire`` (what a call asks a holder and what it answers), ``screen`` (what the
terminal printed, waited on and read back), ``shell`` (the shell's command line and how it
tells that it waits at its prompt), ``holder`` (the holder process) and ``holders`` (the
worker's side: finding, starting, asking and ending the holders of a run).
"""
