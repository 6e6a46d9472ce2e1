"""n > 1: a request's samples run as one engine request each, their steps merged as they come.

Every sample is validated before any runs (a bad request fails whole, before output). Each
step comes out with its sample's index; the merged stream ends when every sample has ended.
A consumer that stops early (its call was cancelled) cancels the samples still running. One
sample takes the direct path, without tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence

from switchyard.mock_engine.data_parallel import DataParallelEngine
from switchyard.mock_engine.generation import MockEngine
from switchyard.mock_engine.types import GenerationRequest, Step

_DONE = object()


async def run_samples(
    engine: MockEngine | DataParallelEngine, jobs: Sequence[GenerationRequest]
) -> AsyncGenerator[tuple[int, Step], None]:
    for job in jobs:
        engine.validate(job)
    if len(jobs) == 1:
        async with contextlib.aclosing(engine.generate(jobs[0])) as steps:
            async for step in steps:
                yield 0, step
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def run(index: int, job: GenerationRequest) -> None:
        try:
            async with contextlib.aclosing(engine.generate(job)) as steps:
                async for step in steps:
                    await queue.put((index, step))
        except Exception as exc:  # surfaced to the consumer below
            await queue.put((index, exc))
        finally:
            await queue.put((index, _DONE))

    tasks = [asyncio.create_task(run(i, job)) for i, job in enumerate(jobs)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                assert isinstance(item, Step)
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
