"""The floor: the other end of a raw Redis LPUSH/BRPOP ping-pong, in a process of its own.

``python -m bench.redis_echo URL`` answers every message on ``PING_KEY`` on ``PONG_KEY`` until it
receives ``STOP``.
"""

from __future__ import annotations

import sys

import redis

PING_KEY = "bench:ping"
PONG_KEY = "bench:pong"
STOP = b"stop"


def echo(url: str) -> None:
    client = redis.Redis.from_url(url)
    while True:
        item = client.brpop([PING_KEY], timeout=0)
        if item is None:
            continue
        _, payload = item
        client.lpush(PONG_KEY, payload)
        if payload == STOP:
            return


if __name__ == "__main__":
    echo(sys.argv[1])
