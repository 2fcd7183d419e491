"""The runs whose sandbox calls must reach one worker: the one holding the run's container.

A pinned run's sandbox calls name the container and go to its worker's own queue. A worker
that is gone (no heartbeat) or answers that it holds no such container makes the call's answer
``environment_lost``, never a run on another worker against other files. Where the run allows
it (``recreate``), the container is started again from its image and a call that never ran is
sent to the new one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from worker.contract.keys import keys
from worker.contract.wire import CommandAnswer, ToolCallRequest, ToolCallResult

#: The pool whose calls a pin redirects: only commands run in the container.
PINNED_POOL = "sandbox"
#: What a call that ran in a container started again (``recreate``) tells the model first.
RECREATED_NOTICE = (
    "[the run's container was lost (its sandbox worker stopped) and started again from {image} "
    "for this command: the workspace is as it was, and everything outside it (packages "
    "installed, files written elsewhere, processes left running) is gone]"
)
#: Ends the answer of a pinned call whose time ran out unstarted, for the model: the call is not
#: sent again (decided on its answer's error kind, ``no_answer``, never on this text).
_NOT_STARTED = " (its time ran out waiting)"


@dataclass(frozen=True, slots=True)
class Pin:
    """A run's container: where it is, and what it is."""

    run_id: str
    environment: str
    worker: str
    queue: str
    image: str
    digest: str
    #: Starts the run's container again (its new pin is returned): None where the run does not
    #: allow it.
    restart: Callable[[], Awaitable[Pin]] | None = None

    def lost(self, request: ToolCallRequest, why: str) -> ToolCallResult:
        return ToolCallResult.failure(
            request,
            "environment_lost",
            f"Error: environment lost: the container of run {self.run_id} (image "
            f"{self.image!r}) on worker {self.worker} {why}. Nothing of {request.tool} ran.",
        )


async def announces_itself(redis: aioredis.Redis, pool: str, worker: str) -> bool:
    """Whether ``worker`` of ``pool`` has a heartbeat; True when the store cannot say, as the
    call's own sending will tell what is wrong with it."""
    try:
        return bool(await redis.exists(keys.worker_heartbeat(pool, worker)))
    except RedisError:
        return True


class RunPins:
    """The pins of one dispatcher's runs."""

    def __init__(self) -> None:
        self._pins: dict[str, Pin] = {}

    def pin(self, pin: Pin) -> None:
        self._pins[pin.run_id] = pin

    def unpin(self, run_id: str) -> Pin | None:
        return self._pins.pop(run_id, None)

    def get(self, run_id: str) -> Pin | None:
        return self._pins.get(run_id)

    async def place(
        self, request: ToolCallRequest, pool: str, redis: aioredis.Redis
    ) -> tuple[ToolCallRequest, str] | ToolCallResult:
        """Where ``request`` goes: as it is to ``pool``, or to its run's container; or, when that
        container's worker is gone, the answer saying so."""
        pin = self._pins.get(request.run_id)
        if pin is None or pool != PINNED_POOL:
            return request, pool
        if not await announces_itself(redis, PINNED_POOL, pin.worker):
            return pin.lost(request, "is gone: its worker no longer announces itself")
        return request.model_copy(update={"environment": pin.environment}), pin.queue

    async def call(
        self,
        request: ToolCallRequest,
        pool: str,
        send: Callable[[ToolCallRequest, str], Awaitable[ToolCallResult]],
        redis: aioredis.Redis,
    ) -> ToolCallResult:
        """``send`` the call where it goes; a container lost before the call ran is started
        again, once, where the run allows it, and the call sent to it."""

        async def call_once(request: ToolCallRequest) -> tuple[ToolCallResult, bool]:
            """The call's answer, and whether its time is spent: no worker took it by its
            deadline (``no_answer``), so it is not sent again."""
            placed = await self.place(request, pool, redis)
            if isinstance(placed, ToolCallResult):
                return placed, False
            answer = await send(*placed)
            return self.settle(placed[0], answer), answer.error_kind == "no_answer"

        result, spent = await call_once(request)
        if result.error_kind != "environment_lost" or spent:
            return result
        try:
            again = await self.recreated(request)
        except Exception as exc:  # whatever stopped it, the lost call's answer says why
            return result.model_copy(
                update={"output": f"{result.output} Starting it again failed: {exc}"}
            )
        if again is None:
            return result
        return self.recreated_notice(again, (await call_once(again))[0])

    def settle(self, request: ToolCallRequest, result: ToolCallResult) -> ToolCallResult:
        """A pinned call that no worker started: its container's worker is gone."""
        pin = self._pins.get(request.run_id)
        if pin is None or request.environment != pin.environment:
            return result
        if result.error_kind == "no_answer":
            # Its time is spent: the next call finds the worker gone, and may start it again.
            lost = pin.lost(request, "did not take the call: its worker stopped")
            return lost.model_copy(update={"output": f"{lost.output}{_NOT_STARTED}"})
        return result

    def recreated_notice(self, request: ToolCallRequest, result: ToolCallResult) -> ToolCallResult:
        """``result``, telling the model that its call ran in a new container: a command's
        answer has it first in its stderr (where its other notices are), any other first in
        its text."""
        pin = self._pins.get(request.run_id)
        image = repr(pin.image) if pin is not None else "its image"
        notice = RECREATED_NOTICE.format(image=image)
        try:
            answer = CommandAnswer.model_validate_json(result.output)
        except ValueError:
            return result.model_copy(update={"output": f"{notice}\n{result.output}"})
        noticed = answer.model_copy(update={"stderr": f"{notice}\n{answer.stderr}"})
        return result.model_copy(update={"output": noticed.model_dump_json()})

    async def recreated(self, request: ToolCallRequest) -> ToolCallRequest | None:
        """After ``environment_lost``, where the run allows it: the container started again and
        the call (which never ran) readied for it, under a new id; None otherwise."""
        pin = self._pins.get(request.run_id)
        if pin is None or pin.restart is None:
            return None
        fresh = await pin.restart()
        self._pins[request.run_id] = fresh
        return request.model_copy(
            update={
                "task_id": f"{request.task_id}.r",
                "environment": fresh.environment,
                "send_number": 1,
            }
        )
