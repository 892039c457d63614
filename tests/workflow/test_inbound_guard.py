"""workflows/inbound_guard.py and bso/data_converter.py on a workflow of their own: a signal whose JSON carries a
lone UTF-16 surrogate is handled by a current worker, while a history in which an older worker dropped it (the
pydantic converter refused it) still replays as it ran."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, Worker

from bso.data_converter import data_converter
from workers.main import WORKFLOW_INTERCEPTORS


@workflow.defn(sandboxed=False)
class AnswerWaiter:
    def __init__(self) -> None:
        self.answer: Any = None

    @workflow.signal
    def answer_signal(self, payload: Any) -> None:
        self.answer = payload

    @workflow.run
    async def run(self) -> str:
        try:
            await workflow.wait_condition(lambda: self.answer is not None, timeout=timedelta(seconds=30))
        except asyncio.TimeoutError:
            return "timed out"
        return f"answered: {self.answer['summary']}"


HALF_AN_EMOJI = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=json.dumps({"summary": "ok \ud83d"}).encode()))


async def _run(client: Client, **worker_options: Any) -> tuple[str, Any]:
    queue = f"guard-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[AnswerWaiter], **worker_options):
        handle = await client.start_workflow(AnswerWaiter.run, id=queue, task_queue=queue)
        await handle.signal("answer_signal", HALF_AN_EMOJI)
        return await handle.result(), await handle.fetch_history()


async def test_a_lone_surrogate_signal_is_handled_and_an_older_run_that_dropped_it_replays(own_ts_env):
    """A server of its own: the older run waits out its timer, which the shared server (its clock held by what
    earlier tests left running) made five real minutes in CI."""
    result, _ = await _run(own_ts_env.client, interceptors=WORKFLOW_INTERCEPTORS)  # BSO's converter (the env's client)
    assert result == "answered: ok \ufffd"

    older = Client(**{**own_ts_env.client.config(), "data_converter": pydantic_data_converter})
    result, history = await _run(older)  # a worker from before: the SDK dropped the signal
    assert result == "timed out"
    replayer = Replayer(workflows=[AnswerWaiter], data_converter=data_converter, interceptors=WORKFLOW_INTERCEPTORS)
    await replayer.replay_workflow(history)  # drops it again: no nondeterminism
