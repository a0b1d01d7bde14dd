"""One request's outputs on the event loop, as both engine clients (`base.py`) hand them out.

Outputs (or an exception) are put from the engine side; the reader gets them in order until every
choice has finished. When the reader has fallen behind (the HTTP side slower than the step loop),
the outputs waiting for one choice are merged into one: the newest cumulative fields with the new
tokens, text and logprobs of all of them, so a lagging stream writes one SSE event instead of
several. The engine's timestamps ride along, so the server's TTFT and inter-token histograms are
unchanged (it spreads a merged output's gap over its tokens).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator

from modeldeploy.runtime.engine.output import RequestOutput


def merge(a: RequestOutput, b: RequestOutput) -> RequestOutput:
    """`b` (the later output of the same choice) carrying `a`'s new tokens, text and logprobs too."""
    return dataclasses.replace(
        b,
        new_token_ids=a.new_token_ids + b.new_token_ids,
        delta_text=a.delta_text + b.delta_text,
        new_logprobs=a.new_logprobs + b.new_logprobs,
    )


class OutputStream:
    def __init__(self, n: int = 1, prompt_token_ids: list[int] | None = None):
        self.prompt_token_ids = prompt_token_ids or []  # the request's, for clients that rebuild outputs
        self.queue: asyncio.Queue = asyncio.Queue()
        self.open_choices = n
        self.finished = False  # every choice has had its final output
        self._held: deque = deque()

    def put(self, item: RequestOutput | BaseException) -> None:
        self.queue.put_nowait(item)

    async def _next(self) -> RequestOutput:
        out = self._held.popleft() if self._held else await self.queue.get()
        while (
            isinstance(out, RequestOutput) and not out.finished and not self._held and not self.queue.empty()
        ):
            nxt = self.queue.get_nowait()
            if isinstance(nxt, RequestOutput) and nxt.index == out.index:
                out = merge(out, nxt)
            else:
                self._held.append(nxt)
        if isinstance(out, BaseException):
            raise out
        return out

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            out = await self._next()
            self.open_choices -= out.finished
            self.finished = self.open_choices == 0
            yield out
