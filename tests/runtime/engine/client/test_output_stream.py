"""OutputStream: in-order outputs until every choice finishes; a lagging reader gets the waiting
outputs of one choice merged (tokens, text and logprobs of all, the newest cumulative fields)."""

from __future__ import annotations

import asyncio

import pytest

from modeldeploy.runtime.engine.client.stream import OutputStream
from modeldeploy.runtime.engine.output import EngineDead, RequestMetrics, RequestOutput


def _out(index: int, toks: list[int], new: list[int], finished: bool = False) -> RequestOutput:
    text = "".join(chr(97 + t) for t in toks)
    return RequestOutput(
        "r",
        [0],
        toks,
        new,
        text,
        "".join(chr(97 + t) for t in new),
        finished,
        "length" if finished else None,
        RequestMetrics(0.0, last_token_time=float(len(toks))),
        index=index,
        new_logprobs=[f"lp{t}" for t in new],
    )


async def _read(stream: OutputStream) -> list[RequestOutput]:
    return [o async for o in stream]


def test_a_lagging_reader_gets_one_merged_output_per_choice_run():
    s = OutputStream(n=2)
    s.put(_out(0, [1], [1]))
    s.put(_out(0, [1, 2], [2]))
    s.put(_out(1, [3], [3]))  # another choice: not merged into choice 0
    s.put(_out(0, [1, 2, 4], [4], finished=True))
    s.put(_out(1, [3, 5], [5], finished=True))
    outs = asyncio.run(_read(s))
    assert [(o.index, o.new_token_ids, o.delta_text, o.finished) for o in outs] == [
        (0, [1, 2], "bc", False),
        (1, [3], "d", False),
        (0, [4], "e", True),
        (1, [5], "f", True),
    ]
    assert outs[0].token_ids == [1, 2] and outs[0].new_logprobs == ["lp1", "lp2"]
    assert outs[0].metrics.last_token_time == 2.0  # the newest output's timestamps
    assert s.finished


def test_a_reader_that_keeps_up_sees_every_output_and_errors_are_raised_in_order():
    async def run() -> list:
        s = OutputStream()
        got = []

        async def read() -> None:
            with pytest.raises(EngineDead):
                async for o in s:
                    got.append(o.new_token_ids)

        reader = asyncio.create_task(read())
        for i in range(3):
            s.put(_out(0, list(range(i + 1)), [i]))
            await asyncio.sleep(0)  # the reader runs between puts
            await asyncio.sleep(0)
        s.put(EngineDead("engine failed: test"))
        await reader
        return got

    assert asyncio.run(run()) == [[0], [1], [2]]
