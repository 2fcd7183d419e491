"""A Lua script's call written straight on a connection of the client's pool, its answer read
when it is wanted.

redis-py's own path for a command (``Script.__call__``, ``execute_command``: its retries, its
metrics, the pool's bookkeeping around each command) costs more CPU than the round trip it makes:
about 130 us for a script's call on this project's 2-core machine, against 50 us written and read
straight on a connection. A worker makes two such calls for every tool call (its start marker
and its answer), so they take the short way, and the long one only when the short fails.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import redis
from redis.commands.core import Script
from redis.connection import Connection

from worker.plumbing.store_refusals import REFUSED_WRITES, as_refusal, until_deadline


@dataclass(eq=False)
class PendingScript:
    """``script`` called with ``keys`` and ``args``: sent as this is made, its answer read once,
    by ``answer``.

    Where the connection fails, the server does not know the script yet or refuses the write,
    ``answer`` asks again through the client, as a script is always called (its retries, the
    script loaded), until ``deadline``; an exception while the answer is awaited drops the
    connection, whose next reply would otherwise be this one's. ``what`` names the call in the
    log of a refusal."""

    client: redis.Redis
    script: Script
    keys: list[str]
    args: list[str | int | bytes]
    _: KW_ONLY
    deadline: float | None = None
    what: str = "a script's call"
    _connection: Connection | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        try:
            self._connection = self.client.connection_pool.get_connection()
            self._connection.send_command(  # type: ignore[no-untyped-call]
                "EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args
            )
        except BaseException as exc:
            self._give_back(broken=True)
            if not isinstance(exc, redis.ConnectionError):
                raise

    def answer(self) -> Any:
        """The script's answer; the first call waits for the server's."""
        connection = self._connection
        if connection is None:
            return self.ask_again()
        try:
            answer = connection.read_response()
        except (redis.ConnectionError, redis.TimeoutError):
            self._give_back(broken=True)
            return self.ask_again()
        except redis.exceptions.NoScriptError:
            self._give_back(broken=False)
            return self.ask_again()
        except redis.ResponseError as exc:
            if not isinstance(as_refusal(exc), REFUSED_WRITES):
                self._give_back(broken=True)
                raise
            # Refused, and said so in full: the connection is fine.
            self._give_back(broken=False)
            return self.ask_again()
        except BaseException:
            self._give_back(broken=True)
            raise
        self._give_back(broken=False)
        return answer

    def discard(self) -> None:
        """The answer is not wanted: the connection goes, unread."""
        self._give_back(broken=True)

    def ask_again(self) -> Any:
        """Through the client, as any script call: loaded if missing, with its retries."""
        return until_deadline(
            lambda: self.script(keys=self.keys, args=self.args), self.deadline, self.what
        )

    def _give_back(self, *, broken: bool) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if broken:
            connection.disconnect()  # type: ignore[no-untyped-call]
        self.client.connection_pool.release(connection)
