"""The sending thread's side of ``Dispatcher``: tool calls made Celery messages, a batch at a time.

A batch goes out in one round trip on a Redis broker (kombu's ``Producer.batch``), its calls'
task-sent events included, as one message (``task.multi``) the way Celery's workers send their
task events: every event receiver (Flower, ``celery events``) reads it as the events one by one.
Other brokers take each message as it is published. Not thread-safe: one sending thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery

from worker.contract.settings import FleetSettings
from worker.contract.wire import TASK_NAME, ToolCallRequest

#: The most calls sent in one batch: enough to amortise the round trip, small enough that the
#: first call of a burst does not wait long for the last.
SEND_BATCH = 256


class CallPublisher:
    """Publishes calls through the sending thread's producer."""

    def __init__(self, app: Celery, settings: FleetSettings) -> None:
        self._app = app
        self._settings = settings
        #: What the calls are published through, bound to the producer's channel.
        self._bound: _Bound | None = None

    def send(self, calls: Sequence[tuple[ToolCallRequest, str]], producer: Any) -> None:
        """Each ``(request, pool)`` of ``calls`` (at most ``SEND_BATCH``) to its pool's queue.
        Should it raise, delivery of the batch is uncertain."""
        bound = self._bound
        if bound is None or bound.channel is not producer.channel:
            bound = self._bound = _Bound(self._app, producer.channel)
        sent = _SentEvents()
        with producer.batch(SEND_BATCH + 1):
            for request, pool in calls:
                self._publish(request, pool, producer, bound, sent)
            bound.announce(sent.events, producer)

    def _publish(
        self,
        request: ToolCallRequest,
        pool: str,
        producer: Any,
        bound: _Bound,
        sent: _SentEvents,
    ) -> None:
        soft = request.timeout_ms / 1000
        queue = bound.queue(pool)
        # Celery's own message and sending, as ``send_task`` makes them, without what a call
        # needs none of and ``send_task`` pays for on every message: its router (the queue is
        # given), the parent task's lookup (the sending thread runs none), an AsyncResult.
        amqp = self._app.amqp
        message = amqp.create_task_message(
            request.task_id,
            TASK_NAME,
            [request.model_dump(mode="json")],
            None,
            reply_to=bound.reply_to,
            time_limit=soft + self._settings.hard_limit_grace_s,
            soft_time_limit=soft,
            # A task-sent event: monitors see the call while it waits in its queue.
            create_sent_event=self._app.conf.task_send_sent_event,
            # Answers come through toolq's reply list: without this, Celery would subscribe
            # to its own result channel for every call.
            ignore_result=True,
            # What monitors (task events, Flower) show for the call: the tool, not its
            # arguments, which can hold whole files; Celery would also spend a repr on them.
            argsrepr=f"({request.tool!r}, run {request.run_id!r})",
            kwargsrepr="{}",
        )
        amqp.send_task_message(
            producer,
            TASK_NAME,
            message,
            queue=queue,
            routing_key=pool,
            declare=[queue],
            event_dispatcher=sent,
            # The sending loop retries, for as long as each call's deadline allows.
            retry=False,
        )


class _SentEvents:
    """Takes the task-sent events ``send_task_message`` publishes, as its event dispatcher, to
    send a batch's together (``_Bound.announce``)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, type: str, fields: dict[str, Any], producer: Any, **options: Any) -> None:
        self.events.append(fields)


class _Bound:
    """The pools' queues and the task-sent events' dispatcher, bound once to the channel of the
    sending thread's producer. Given by name, kombu copies and binds a queue, its exchange and
    the events' exchange anew for every message (then finds each already declared, by its hash):
    a quarter of a publish. Made again when the producer's channel changes."""

    def __init__(self, app: Celery, channel: Any) -> None:
        self.channel = channel
        self._app = app
        self._queues: dict[str, Any] = {}
        # Task-sent events go out a batch's at a time, in one message (``task.multi``), as
        # Celery's workers send their task events: every event receiver (Flower, `celery
        # events`) reads it as the events one by one. A message per call cost a third of the
        # call's publish.
        self.events = app.events.Dispatcher(
            channel=channel,
            buffer_group=["task"],
            buffer_limit=SEND_BATCH,
            # An event message that cannot be sent fails its batch, which is sent again, events
            # and all: nothing is kept aside for a flush that never comes.
            buffer_while_offline=False,
        )
        self.events.exchange = self.events.exchange.bind(channel)
        #: The sending thread's id as Celery names a caller (``send_task``'s ``reply_to``).
        self.reply_to = app.thread_oid

    def announce(self, sent: list[dict[str, Any]], producer: Any) -> None:
        """The task-sent events of a batch, through ``producer``: in the batch's round trip."""
        if not sent:
            return
        self.events.producer = producer
        for fields in sent:
            self.events.send("task-sent", **fields)
        self.events.flush(errors=False)

    def queue(self, pool: str) -> Any:
        """The queue of ``pool`` (or of a worker's own, for a pinned run), as Celery knows it."""
        queue = self._queues.get(pool)
        if queue is None:
            queue = self._queues[pool] = self._app.amqp.queues[pool].bind(self.channel)
        return queue
