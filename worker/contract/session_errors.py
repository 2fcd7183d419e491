"""How a run's shell session can be gone: lost with its worker, or ended (idle, or its run's
end). Each carries one line for the model: which session, why, and what starts a new one."""

from __future__ import annotations

from worker.contract.errors import ToolqError

#: What every such line ends with: the way to a new shell, which is never started unasked.
RESTART_HINT = "action 'restart' starts a new shell (nothing of the old one is kept)"


class SessionGone(ToolqError, RuntimeError):
    """The session's shell is no more: the call typed nothing."""


class SessionLost(SessionGone):
    """The worker that held the session stopped, and the shell with it (``session_lost``)."""


class SessionEnded(SessionGone):
    """The session ended as it should (idle past the operator's time, its run's workspace
    removed, its shell failed to start)."""
