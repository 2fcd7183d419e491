"""Whether the configured broker and result store answer, asked once before a command starts.

A wrong address, a server that is down or a password the broker refuses is then one line
naming the URL (its password hidden), the cause and what to check, within seconds: otherwise
every tool call would retry until its deadline and fail on its own.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import amqp.exceptions
import redis
from kombu import Connection
from kombu.utils.url import maybe_sanitize_url

from api.exceptions import FleetUnreachableError
from worker.contract.settings import RESULT_SCHEMES, FleetSettings

#: How long each server has to answer: a broker on the same network answers in milliseconds.
CONNECT_TIMEOUT_S = 3.0


def check_connections(settings: FleetSettings, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Connect to the broker, then to the result store when it is another server; raise
    ``FleetUnreachableError`` for the first that fails."""
    broker = settings.effective_broker_url
    if urlsplit(broker).scheme in RESULT_SCHEMES:
        _check_redis(broker, "the broker", "TOOLQ_BROKER_URL", timeout_s)
    else:
        _check_amqp(broker, timeout_s)
    if settings.redis_url != broker:
        _check_redis(settings.redis_url, "the result store", "TOOLQ_RESULT_BACKEND", timeout_s)


def _check_redis(url: str, role: str, variable: str, timeout_s: float) -> None:
    client = redis.Redis.from_url(
        url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, retry_on_timeout=False
    )
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise _unreachable(
            role, url, variable, f"login refused ({_text(exc)})", _CHECK_LOGIN
        ) from exc
    except redis.ResponseError as exc:
        raise _unreachable(role, url, variable, f"refused ({_text(exc)})", _CHECK_URL) from exc
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise _network_failure(role, url, variable, exc, timeout_s) from exc
    finally:
        client.close()


def _check_amqp(url: str, timeout_s: float) -> None:
    role, variable = "the broker", "TOOLQ_BROKER_URL"
    connection = Connection(url, connect_timeout=timeout_s)
    try:
        # No retries: kombu's own would hold a dead broker for several seconds per try.
        connection.ensure_connection(max_retries=0, reraise_as_library_errors=False)
    except amqp.exceptions.AccessRefused as exc:
        reason = f"login refused ({_amqp_reason(exc)})"
        raise _unreachable(role, url, variable, reason, _CHECK_LOGIN) from exc
    except amqp.exceptions.AMQPError as exc:
        reason = f"refused ({_amqp_reason(exc, detail=True)})"
        raise _unreachable(role, url, variable, reason, _CHECK_URL) from exc
    except OSError as exc:
        raise _network_failure(role, url, variable, exc, timeout_s) from exc
    finally:
        connection.release()


_CHECK_LOGIN = "check the user name and password in the URL"
_CHECK_URL = "check the URL"


def _network_failure(
    role: str, url: str, variable: str, exc: BaseException, timeout_s: float
) -> FleetUnreachableError:
    """Refused, unknown host or no answer, whichever the chain of ``exc`` shows."""
    causes = _chain(exc)
    host = urlsplit(url).hostname or "localhost"
    if any(isinstance(cause, ConnectionRefusedError) for cause in causes):
        cause = "connection refused"
        check = "check that it is running and listens on that host and port"
    elif any(isinstance(cause, socket.gaierror) for cause in causes):
        cause, check = f"unknown host {host!r}", "check the host name"
    elif any(isinstance(cause, TimeoutError | redis.TimeoutError) for cause in causes):
        cause = f"no answer within {timeout_s:g} s"
        check = "check the host and port, and that no firewall drops the connection"
    else:
        cause, check = _text(exc), _CHECK_URL
    return _unreachable(role, url, variable, cause, check)


def _unreachable(
    role: str, url: str, variable: str, cause: str, check: str
) -> FleetUnreachableError:
    shown = maybe_sanitize_url(url)
    return FleetUnreachableError(
        f"cannot connect to {role} at {shown} ({variable}): {cause}; {check}"
    )


def _amqp_reason(exc: amqp.exceptions.AMQPError, *, detail: bool = False) -> str:
    """``403 ACCESS_REFUSED`` from the broker's "ACCESS_REFUSED - Login was refused ...", or
    with ``detail`` all of it ("530 NOT_ALLOWED - vhost x not found")."""
    text = str(exc.reply_text or "")
    if not exc.reply_code:
        return str(exc)
    return f"{exc.reply_code} {text if detail else text.split(' - ', 1)[0]}".strip()


def _text(exc: BaseException) -> str:
    return str(exc).rstrip(".") or type(exc).__name__


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
