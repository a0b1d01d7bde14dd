"""Fuzzing request bodies against the real server: whatever arrives, never a 5xx.

Hypothesis mixes well-formed fields, wrong types, junk keys and raw bytes on all three
generation endpoints (500 cases). A 4xx must be an OpenAI error object; a 200 must be a
complete answer (streams read to the end).
"""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeldeploy.runtime import EngineConfig
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer

junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=6,
)
small = st.integers(-2, 6)
text = st.text(max_size=30)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "developer", "tool"]) | junk,
        "content": text
        | st.lists(
            st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "image"]), "text": text}),
            max_size=2,
        )
        | junk,
    },
    optional={"name": text | junk, "type": st.just("message") | junk},
)
FIELDS = {
    "model": st.sampled_from(["tiny", "tiny", "other"]) | junk,
    "prompt": text | st.lists(st.integers(-3, 600), max_size=12) | junk,
    "messages": st.lists(message, max_size=3) | junk,
    "input": text | st.lists(message, max_size=2) | junk,
    "max_tokens": small | junk,
    "max_completion_tokens": small | junk,
    "max_output_tokens": small | junk,
    "temperature": st.floats(-1, 3, allow_nan=False) | junk,
    "top_p": st.floats(-0.5, 1.5, allow_nan=False) | junk,
    "top_k": st.integers(-3, 40) | junk,
    "seed": st.integers(-5, 2**64) | junk,
    "stop": text | st.lists(st.text(max_size=3), max_size=3) | junk,
    "stream": st.booleans() | junk,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | junk, "x": junk})
    | junk,
    "n": st.integers(-1, 3) | junk,
    "user": text | junk,
    "ignore_eos": st.booleans() | junk,
    "logit_bias": junk,
    "logprobs": junk,
    "tools": junk,
}
OPTIONAL_VALID = {
    "temperature": st.floats(0, 2, allow_nan=False),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 40),
    "seed": st.integers(0, 2**32),
    "stop": st.text(min_size=1, max_size=3),
    "user": text,
    "ignore_eos": st.booleans(),
    "stream": st.booleans(),
}
VALID = {
    "/v1/completions": st.fixed_dictionaries(
        {
            "model": st.just("tiny"),
            "prompt": st.text(min_size=1, max_size=30)
            | st.lists(st.integers(0, 500), min_size=1, max_size=12),
            "max_tokens": st.integers(1, 6),
        },
        optional=OPTIONAL_VALID,
    ),
    "/v1/chat/completions": st.fixed_dictionaries(
        {
            "model": st.just("tiny"),
            "messages": st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "system", "assistant"]), "content": text}
                ),
                min_size=1,
                max_size=3,
            ),
            "max_tokens": st.integers(1, 6),
        },
        optional=OPTIONAL_VALID,
    ),
    "/v1/responses": st.fixed_dictionaries(
        {
            "model": st.just("tiny"),
            "input": st.text(min_size=1, max_size=30),
            "max_output_tokens": st.integers(1, 6),
        },
        optional=OPTIONAL_VALID,
    ),
}


@st.composite
def requests(draw) -> tuple[str, bytes]:
    """Valid bodies, valid bodies with 1-2 fields broken or added, random dicts, junk JSON, raw bytes."""
    path = draw(st.sampled_from(PATHS))
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "random", "junk", "bytes"]))
    if kind == "bytes":
        return path, draw(st.binary(max_size=40))
    if kind == "junk":
        return path, json.dumps(draw(junk)).encode()
    if kind == "random":
        return path, json.dumps(draw(st.fixed_dictionaries({}, optional=FIELDS))).encode()
    body = draw(VALID[path])
    if kind == "mutated":
        keys = draw(
            st.lists(st.sampled_from(list(FIELDS)) | st.text(min_size=1, max_size=8), min_size=1, max_size=2)
        )
        for key in keys:
            body[key] = draw(FIELDS.get(key, junk))
    return path, json.dumps(body).encode()


SEEN: Counter = Counter()  # status codes, so the run proves it reached both sides
PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/responses"]


@pytest.fixture(scope="module")
def fuzz_server(llama_dir):
    ecfg = EngineConfig(model=str(llama_dir), device="cpu", dtype="float32", max_num_seqs=4, max_model_len=64)
    with (
        ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny", max_queue=16)) as s,
        s.client(timeout=60) as c,
    ):
        yield s, c


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(req=requests())
def test_fuzzed_bodies_never_5xx(fuzz_server, req):
    s, c = fuzz_server
    path, body = req
    with c.stream("POST", path, content=body, headers={"Content-Type": "application/json"}) as r:
        raw = r.read()
    SEEN[r.status_code] += 1
    assert r.status_code < 500, (path, body, raw[:300])
    if r.status_code != 200:
        err = json.loads(raw)["error"]
        assert isinstance(err["message"], str) and err["message"] and "type" in err
    elif r.headers["content-type"].startswith("text/event-stream"):
        if path == "/v1/responses":
            assert raw.split(b"event: ")[-1].startswith((b"response.completed", b"response.incomplete")), raw[
                -300:
            ]
        else:
            assert raw.rstrip().endswith(b"data: [DONE]"), raw[-300:]
    else:
        assert json.loads(raw)["usage"]


def test_fuzz_left_the_server_clean(fuzz_server):
    s, _ = fuzz_server
    assert sum(SEEN.values()) >= 500 and SEEN[200] >= 25 and SEEN[400] >= 100, SEEN
    assert s.ctx.metrics.count("error") == 0
    st_ = s.ctx.engine.stats()
    assert st_.num_free_blocks == st_.num_total_blocks and s.ctx.admission.running == 0
    assert httpx.get(s.url + "/health/ready").status_code == 200
