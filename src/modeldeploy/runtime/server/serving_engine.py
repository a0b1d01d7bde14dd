"""The pipeline every generation endpoint shares: parse -> check -> submit -> collect or stream.

`OpenAIServing.handle` is one request's whole path, read top to bottom. An endpoint's subclass
(serving_completion.py, serving_chat.py, serving_responses.py) supplies only what differs: its
request schema, how a request becomes prompt tokens and sampling parameters (`prepare`), and the
shapes of its answer (`full_response`) and of its stream (`stream`). A refusal before submission
is counted here, once; from submission on, `Job.close` counts the outcome.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from modeldeploy.runtime.engine.output import EngineDead, RequestOutput
from modeldeploy.runtime.server import evidence
from modeldeploy.runtime.server import structured as S
from modeldeploy.runtime.server.context import ServerContext
from modeldeploy.runtime.server.errors import APIError
from modeldeploy.runtime.server.job import ClientGone, Job, race_disconnect
from modeldeploy.runtime.server.metrics import refusal_outcome
from modeldeploy.runtime.server.protocol import GenerationRequest, ResponseFormat
from modeldeploy.runtime.server.request_input import check_model_name, read_body, request_deadline
from modeldeploy.runtime.server.sse import SSEResponse, event

if TYPE_CHECKING:
    from modeldeploy.runtime.engine.sampling_params import SamplingParams

Req = TypeVar("Req", bound=GenerationRequest)


@dataclass
class Prepared:
    """What a request becomes before it is submitted: prompt tokens, sampling, and its tool plan."""

    ids: list[int]
    params: SamplingParams
    plan: S.ToolPlan = field(default_factory=lambda: S.ToolPlan("none"))


@dataclass
class Generation(Generic[Req]):
    """A submitted request, as its endpoint's answer and stream need it."""

    req: Req
    rid: str
    created: int
    ids: list[int]  # the prompt's tokens
    plan: S.ToolPlan
    tok: Any  # the engine's tokenizer
    job: Job

    @property
    def model(self) -> str:
        """The base model's name or the adapter's, as the client asked."""
        return self.req.model

    async def outputs(self, first: RequestOutput) -> AsyncIterator[RequestOutput]:
        """Every output of a stream: the first (already awaited at submission), then the rest."""
        yield first
        async for out in self.job.outputs():
            yield out


class OpenAIServing(ABC, Generic[Req]):
    """One generation endpoint over the shared pipeline; a subclass per endpoint."""

    id_prefix: ClassVar[str]  # of the response id: "cmpl-", "chatcmpl-", "resp_"

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    # ---- what an endpoint supplies -----------------------------------------------------
    @abstractmethod
    def parse(self, raw: bytes) -> Req:
        """The body as this endpoint's request (protocol.parse_body: a 400 naming the field)."""

    @abstractmethod
    def needs_grammar(self, req: Req) -> bool:
        """Whether `prepare` checks a JSON Schema (tools, a json_schema format): then it runs on a
        worker thread, since schema checks are Python work that would hold up the other streams."""

    @abstractmethod
    def prepare(self, req: Req) -> Prepared:
        """Tokens, sampling parameters and tool plan; a 400 naming the field for anything the request
        asks that this server cannot do. Bounds that need no tokenizing are checked first, so a
        refusal costs no template render."""

    @abstractmethod
    def full_response(self, gen: Generation[Req], outs: list[RequestOutput]) -> dict[str, Any]:
        """The non-streamed body, from every choice's final output."""

    @abstractmethod
    def stream(self, gen: Generation[Req], first: RequestOutput) -> AsyncIterator[bytes]:
        """The SSE events of a streamed answer, ending as this endpoint's stream ends."""

    # ---- the pipeline ------------------------------------------------------------------
    async def handle(self, request: Request) -> Response:
        """parse -> check -> submit -> collect (JSON) or stream (SSE)."""
        arrival = time.monotonic()
        self._check_serving()
        req, adapter, budget, prepared = await self._parse_and_check(request)
        rid = self.id_prefix + uuid.uuid4().hex
        job = Job(self.ctx, rid, prepared.ids, prepared.params, arrival, adapter, budget)
        job.evidence = evidence.of(request)
        created = int(time.time())
        try:
            first_or_final = await race_disconnect(request, job.start() if req.stream else job.run())
        except ClientGone:
            await job.close(client_gone=True)
            return Response(status_code=499)  # nobody reads it; the client is gone
        except EngineDead as e:
            job.server_aborted = True
            await job.close(client_gone=False)
            raise APIError(503, str(e), code="engine_failed") from None
        except BaseException:
            await job.close(client_gone=False)
            raise
        gen = Generation(req, rid, created, prepared.ids, prepared.plan, self.ctx.engine.tokenizer, job)
        if not req.stream:
            await job.close(client_gone=False)
            return JSONResponse(self.full_response(gen, first_or_final))
        body = _until_engine_fails(job, self.stream(gen, first_or_final))
        return SSEResponse(body, on_close=lambda: job.close(client_gone=True))

    def _check_serving(self) -> None:
        """503 while loading, failed or draining, counted as a refusal before anything is read."""
        try:
            self.ctx.check_serving()
        except APIError as e:
            self.ctx.metrics.outcome(refusal_outcome(e.status))
            raise
        except Exception:
            self.ctx.metrics.outcome("error")
            raise

    async def _parse_and_check(self, request: Request) -> tuple[Req, str | None, float | None, Prepared]:
        """The request, the adapter it selects, the client's deadline, and what it becomes; any refusal
        is counted under the adapter once it is known."""
        adapter = None
        try:
            budget = request_deadline(request)
            raw = await read_body(request, self.ctx.cfg.limits.max_body_bytes)
            req = self.parse(raw)
            check_model_name(self.ctx, req.model)
            adapter = self.ctx.check_model(req.model)
            if self.needs_grammar(req):
                prepared = await asyncio.to_thread(self.prepare, req)
            else:
                prepared = self.prepare(req)
        except APIError as e:
            self.ctx.metrics.outcome(refusal_outcome(e.status), adapter or "")
            raise
        except Exception:
            self.ctx.metrics.outcome("error", adapter or "")
            raise
        return req, adapter, budget, prepared

    # ---- helpers for the endpoints -----------------------------------------------------
    def response_format(self, rf: ResponseFormat | None) -> Any:
        """The decoding constraint of `response_format` (None: unconstrained)."""
        if self.ctx.cfg.ignore_response_format:  # the test hook: an engine that ignores the format
            rf = None
        return S.from_response_format(rf, self.ctx.cfg.limits.schema())

    def check_logprob_entries(self, param: str, top: int | None, n: int) -> None:
        """n x top_logprobs: the entries the server formats for each generated position."""
        bound = self.ctx.cfg.limits.max_logprob_entries
        if top is not None and n * top > bound:
            raise APIError(
                400,
                f"{param}: n ({n}) x {param} ({top}) = {n * top} logprob entries per token, over {bound} "
                "(limit: --max-logprob-entries)",
                param=param,
                code="too_many_logprobs",
            )


def is_json_schema(fmt: Any) -> bool:
    """A format (response_format, text.format) whose JSON Schema `prepare` checks."""
    return fmt is not None and fmt.type == "json_schema"


def new_logprob_ids(out: RequestOutput) -> list[int]:
    """The generated tokens whose logprobs arrived with this output."""
    return out.token_ids[len(out.token_ids) - len(out.new_logprobs) :]


async def _until_engine_fails(job: Job, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A stream whose engine dies mid-way (a dead tensor-parallel rank, a crashed step loop) ends with
    an error event and no [DONE], so the client knows at once; the outcome is the server's error."""
    try:
        async for chunk in body:
            yield chunk
    except EngineDead as e:
        job.server_aborted = True
        yield event({"error": {"message": str(e), "type": "engine_error", "code": "engine_failed"}})
