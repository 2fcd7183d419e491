"""A run's environment from its image: the run's container started on a sandbox worker before
the run's first command, its calls pinned to that worker (``api.calls.pins``), and ended when
the run ends. Used by batch tasks, ``toolq run --image``, the Agent, Inspect and MCP alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any

from pydantic import ValidationError

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.calls.pins import PINNED_POOL, Pin
from api.exceptions import ImageUnavailable
from api.images.fields import ImageFields
from api.runs.workspace import call_operation
from worker.contract.deadlines import END_ENVIRONMENT_TIMEOUT_MS
from worker.contract.operations import (
    END_ENVIRONMENT,
    START_ENVIRONMENT,
    AnswerT,
    ImageRefusal,
    NoArguments,
    Operation,
    RequestT,
    StartEnvironmentRequest,
    request_problems,
)

#: A look at an image before a run starts from it: the line refusing it, or None.
ImageVet = Callable[[str], Awaitable[str | None]]


@dataclass(frozen=True, slots=True)
class StartedEnvironment:
    """A run's container, as its worker started it."""

    image: str
    digest: str
    worker: str
    queue: str
    environment: str
    runtime: str
    workdir: str
    start_ms: int
    pulled: bool

    def as_record(self) -> dict[str, Any]:
        """What a result line records of it."""
        return {
            "reference": self.image,
            "digest": self.digest,
            "worker": self.worker,
            "runtime": self.runtime,
            "start_ms": self.start_ms,
            "pulled": self.pulled,
        }


@dataclass(eq=False)
class RunEnvironment:
    """The container of run ``run_id`` from ``image`` on the fleet ``fleet`` describes.

    ``user`` and ``env`` replace the image's User and add to its Env; ``recreate`` lets a
    container lost mid-run (its worker died) start again from the image, where otherwise the
    run's next command fails with "environment lost"; ``timeout_ms`` bounds its start (None:
    the worker's own limit)."""

    dispatcher: Dispatcher = field(repr=False)
    fleet: Fleet = field(repr=False)
    run_id: str
    image: str
    _: KW_ONLY
    user: str | None = None
    env: Mapping[str, str] | None = None
    recreate: bool = False
    timeout_ms: int | None = None
    #: Looks at the image before any worker is asked, and says why it is refused (a token's
    #: run: ``api.images.sources``); None: the workers' own allowlist alone.
    vet: ImageVet | None = field(default=None, repr=False)
    #: The container once it has started.
    started: StartedEnvironment | None = field(default=None, init=False)

    @classmethod
    def for_run(
        cls, dispatcher: Dispatcher, fleet: Fleet, run_id: str, fields: ImageFields
    ) -> RunEnvironment | None:
        """The environment of a run whose ``fields`` name an image; None without one."""
        if fields.image is None:
            return None
        return cls(
            dispatcher,
            fleet,
            run_id,
            fields.image,
            user=fields.user,
            env=fields.env,
            recreate=fields.recreate,
        )

    async def ensure_started(self) -> StartedEnvironment:
        """The container, started now unless it was already."""
        return self.started if self.started is not None else await self.start()

    async def start(self) -> StartedEnvironment:
        """Start the run's container (resolving the image to a digest, pulling and unpacking it
        where the worker's cache lacks it) and pin the run's commands to it.
        ``ImageUnavailable`` when it cannot."""
        if self.vet is not None and (refused := await self.vet(self.image)) is not None:
            raise ImageUnavailable(refused)
        spec = self.fleet.tools.get(START_ENVIRONMENT.name)
        if spec is None:
            raise ImageUnavailable(
                f"image {self.image!r}: no worker of this fleet runs images "
                f"({START_ENVIRONMENT.name} is not served: sandbox workers of an older toolq?)"
            )
        if not self.fleet.serves(START_ENVIRONMENT.name):
            raise ImageUnavailable(f"image {self.image!r}: no live sandbox worker to run it")
        # Unset, the worker's own limit applies, which the fleet publishes as the tool's.
        limit = {} if self.timeout_ms is None else {"timeout_ms": self.timeout_ms}
        try:
            request = StartEnvironmentRequest(
                image=self.image, user=self.user, env=dict(self.env or {}), **limit
            )
        except ValidationError as exc:
            raise ImageUnavailable(
                f"image {self.image!r}: invalid arguments for {START_ENVIRONMENT.name}: "
                f"{request_problems(exc)}."
            ) from None
        # A start goes to any sandbox worker; the one that answers holds the container.
        self.dispatcher.pins.unpin(self.run_id)
        answer = await self._call(START_ENVIRONMENT, request, spec.pool)
        # The image as the run names it; all else as the worker answered, field by field.
        answered = [each.name for each in fields(StartedEnvironment) if each.name != "image"]
        started = StartedEnvironment(
            image=self.image, **{name: getattr(answer, name) for name in answered}
        )
        self.started = started
        self.dispatcher.pins.pin(self._pin(started))
        return started

    def record(self) -> dict[str, Any] | None:
        """What a transcript or result line records of the container: None before it started."""
        return None if self.started is None else self.started.as_record()

    async def end(self) -> None:
        """End the run's container (nothing when it has none, or its worker is gone: the
        worker's next sweep ends it)."""
        if self.dispatcher.pins.get(self.run_id) is None:
            return
        try:
            await self._call(
                END_ENVIRONMENT, NoArguments(), PINNED_POOL, END_ENVIRONMENT_TIMEOUT_MS
            )
        except ImageUnavailable:
            pass  # lost already; nothing more to end here
        finally:
            self.dispatcher.pins.unpin(self.run_id)

    def _pin(self, started: StartedEnvironment) -> Pin:
        return Pin(
            run_id=self.run_id,
            environment=started.environment,
            worker=started.worker,
            queue=started.queue,
            image=self.image,
            digest=started.digest,
            restart=self._restart if self.recreate else None,
        )

    async def _restart(self) -> Pin:
        started = await self.start()
        return self._pin(started)

    async def _call(
        self,
        operation: Operation[RequestT, AnswerT, ImageRefusal],
        request: RequestT,
        pool: str,
        timeout_ms: int | None = None,
    ) -> AnswerT:
        """The operation's answer; ``ImageUnavailable`` for a refusal or a failed call."""
        spec = self.fleet.tools.get(operation.name)
        if spec is None:
            raise ImageUnavailable(
                f"image {self.image!r}: no worker of this fleet offers {operation.name}"
            )
        result = await call_operation(
            self.dispatcher,
            spec,
            self.run_id,
            operation.arguments(request),
            pool=pool,
            timeout_ms=timeout_ms,
        )
        if result.is_error:
            raise ImageUnavailable(f"image {self.image!r}: {_first_line(result.output)}")
        answer = operation.read_answer(result.output)
        if isinstance(answer, ImageRefusal):
            raise ImageUnavailable(answer.message or f"image {self.image!r}: refused")
        return answer


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "no answer"
    return line.removeprefix("Error: ")
