"""One generation request: admission slot, engine sequence, metrics, cleanup.

`close()` is the single exit for every path (finished, client gone, error): it aborts the
engine sequence if it has not finished (freeing its KV blocks within one engine step),
releases the admission slot and records the outcome once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Any

from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.metrics import refusal_outcome

log = logging.getLogger("modeldeploy.server")


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class Job:
    def __init__(
        self,
        ctx: Any,
        rid: str,
        prompt: list[int],
        params: Any,
        arrival: float,
        adapter: str | None = None,
        budget_s: float | None = None,
    ):
        self.ctx, self.rid, self.prompt, self.params = ctx, rid, prompt, params
        self.budget_s = budget_s  # the client's x-request-deadline-ms, if it sent one
        self.adapter = adapter  # LoRA adapter name; None = the base model
        self.tracker = ctx.metrics.tracker(arrival, adapter or "")
        self.ticket = None
        self.agen: AsyncGenerator[Any, None] | None = None
        self.final: Any = None  # the last output, once every choice has finished
        self.finals: dict[int, Any] = {}  # choice index -> its final output
        self.refused: str | None = None  # outcome of a request refused before generation
        self.server_aborted = False  # drain timeout: not the client's doing
        self.last: Any = None  # the latest output (its metrics and tokens), for the request's evidence
        self.evidence: Any = None  # evidence.Evidence of this HTTP request, if the middleware made one

    async def start(self) -> Any:
        """Compile any grammar (off the step loop), wait for a running slot, submit to the engine,
        return its first output."""
        spec = getattr(self.params, "structured", None)
        if spec is not None and spec.compiled is None:
            timeout = self.ctx.cfg.limits.grammar_compile_timeout_s
            try:
                result = await asyncio.wait_for(self.ctx.engine.compile(self.params), timeout)
            except ValueError as e:
                self.refused = "invalid"
                raise APIError(400, str(e), param="response_format") from None
            except TimeoutError:  # xgrammar cannot stop it: it finishes on the engine's compile thread
                self.refused = "invalid"
                raise APIError(
                    400,
                    f"response_format: the grammar did not compile within {timeout:g}s "
                    "(limit: --grammar-compile-timeout)",
                    param="response_format",
                    code="grammar_too_large",
                ) from None
            self.ctx.metrics.grammar_compile(result.seconds, result.cached)
        try:
            self.ticket = self.ctx.admission.enter(len(self.prompt), self.budget_s)
            await self.ticket.acquire()  # refuses a request that waited past its budget
        except APIError as e:
            self.refused = refusal_outcome(e.status)
            raise
        self.ctx.jobs[self.rid] = self
        if self.adapter:
            agen = self.ctx.engine.generate(self.rid, self.prompt, self.params, adapter=self.adapter)
        else:
            agen = self.ctx.engine.generate(self.rid, self.prompt, self.params)
        self.agen = agen
        try:
            first = await agen.__anext__()
        except ValueError as e:  # the engine's own prompt validation
            self.refused = "invalid"
            raise APIError(400, str(e), param="prompt") from None
        self._see(first)
        return first

    async def outputs(self) -> AsyncIterator[Any]:
        """The outputs after the first one."""
        if self.final is not None or self.agen is None:
            return
        async for out in self.agen:
            self._see(out)
            yield out

    async def run(self) -> list[Any]:
        """Start and run to the end (non-streaming): every choice's final output, by index."""
        await self.start()
        async for _ in self.outputs():
            pass
        return [self.finals[i] for i in sorted(self.finals)]

    def _see(self, out: Any) -> None:
        self.tracker.observe(out)
        self.last = out
        if out.finished:
            self.finals[out.index] = out
            if len(self.finals) == getattr(self.params, "n", 1):
                self.final = out

    async def close(self, client_gone: bool) -> None:
        if self.tracker.done:
            return
        if self.final is None and self.agen is not None:
            self.ctx.engine.abort(self.rid)
            try:
                await self.agen.aclose()
            except Exception:  # noqa: BLE001 - cleanup must finish
                log.exception("closing generation %s", self.rid)
        if self.ticket is not None:
            self.ticket.release()
        self.ctx.jobs.pop(self.rid, None)
        if self.refused:
            outcome = self.refused
        elif self.final is not None and self.final.finish_reason != "abort":
            outcome = "completed"
        elif self.server_aborted:
            outcome = "error"
        elif client_gone:
            outcome = "cancelled"
        else:
            outcome = "error"
        self.tracker.finish(outcome, self.final)
        if self.evidence is not None:
            self.evidence.job_done(self, outcome)


async def race_disconnect(request: Any, work: Awaitable[Any]) -> Any:
    """Run `work` until done, or raise ClientGone (cancelling it) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watch.cancel()
        raise
    if task in done:
        watch.cancel()
        return task.result()
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - the work is abandoned; its error no longer matters
        pass
    raise ClientGone


async def _disconnected(request: Any) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
