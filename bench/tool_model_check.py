"""Figures for the trained tool-calling test model (bench/results/structured_output.md).

Trains `modeldeploy_dev.tool_model` (timed), then on the engine, sampled at temperature 1 with
seeds 0..N-1, the `auto` constraint (xgrammar triggered tag) and the server's call parser:
- weather questions with tools: how many open a call, how many calls validate, how many name the
  asked city (copying is not trained for; informative only);
- greetings with tools: how many answer in text with no call;
- json_object on JSON requests: how many parse, with no logit_bias.

    .venv/bin/python bench/tool_model_check.py [--n 100] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import jsonschema

from modeldeploy.runtime import LLM, SamplingParams
from modeldeploy.runtime.engine.structured_output.grammar import schema_spec, tool_tag_spec
from modeldeploy.runtime.server.toolcalls import CALL_BEGIN, CALL_END, parse
from modeldeploy_dev.tool_model import ASKS, CHATS, CITIES, TOOLS, WEATHER, make_tool_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="tool-model-")
    t = time.perf_counter()
    make_tool_model(out)
    train_s = time.perf_counter() - t
    llm = LLM(out, dtype="float32", max_num_seqs=a.n, max_model_len=1024)

    def chat(text: str, tools: list | None) -> str:
        msgs = [{"role": "user", "content": text}]
        return llm.tokenizer.apply_chat_template(
            msgs, tools=tools, tokenize=False, add_generation_prompt=True
        )

    call_schema = {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER},
        "required": ["name", "arguments"],
    }
    auto = lambda i: SamplingParams(  # noqa: E731
        max_tokens=120,
        temperature=1.0,
        seed=i,
        structured=tool_tag_spec(call_schema, CALL_BEGIN, CALL_END, False),
    )
    cities = [CITIES[i % len(CITIES)] for i in range(a.n)]
    asks = [
        chat(ASKS[i % 3].format(city=c, days=1 + i % 7, unit="celsius"), TOOLS) for i, c in enumerate(cities)
    ]
    called = valid = same_city = 0
    for o, c in zip(llm.generate(asks, [auto(i) for i in range(a.n)]), cities, strict=True):
        _, calls = parse("auto", None, o.text, final=True)
        if calls:
            called += 1
            args = json.loads(calls[0].arguments)
            jsonschema.validate(args, WEATHER)
            valid += 1
            same_city += args["city"] == c
    hellos = [chat(CHATS[i % len(CHATS)][0], TOOLS) for i in range(a.n)]
    text_only = sum(
        not parse("auto", None, o.text, final=True)[1] and o.finish_reason == "stop"
        for o in llm.generate(hellos, [auto(i) for i in range(a.n)])
    )
    jsons = [chat(f"Give me JSON for {c}", None) for c in cities]
    jp = [
        SamplingParams(max_tokens=120, temperature=1.0, seed=i, structured=schema_spec("json_object"))
        for i in range(a.n)
    ]
    parsed = 0
    for o in llm.generate(jsons, jp):
        try:
            parsed += o.finish_reason == "stop" and isinstance(json.loads(o.text), dict)
        except json.JSONDecodeError:
            pass
    print(f"train_seconds {train_s:.1f}")
    print(f"weather+tools: called {called}/{a.n}, valid {valid}/{called}, asked city {same_city}/{called}")
    print(f"greeting+tools: text without a call {text_only}/{a.n}")
    print(f"json_object: parsed {parsed}/{a.n}")


if __name__ == "__main__":
    main()
