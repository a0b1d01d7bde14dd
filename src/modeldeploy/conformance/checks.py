"""The serving-contract checks, one function each, field by field.

Each takes a Target and returns a CheckResult with the raw observations that decided it,
so the JSON evidence record shows why a canary passed or failed, not just that it did.
"""

from __future__ import annotations

from typing import Any

import httpx

from modeldeploy.conformance.http import error_field, iter_sse
from modeldeploy.conformance.prom import scrape
from modeldeploy.conformance.result import CheckResult, Target

PROMPT = "The quick brown fox jumps over the lazy dog. Kubernetes schedules pods onto"
MESSAGES = [{"role": "user", "content": "Say something about paged KV caches."}]
UNSUPPORTED = "conformance_unsupported_field"


def _cancelled(m) -> float:
    return m.get("modeldeploy_requests_total", outcome="cancelled") or 0.0


def readiness(t: Target) -> CheckResult:
    res = CheckResult("readiness")
    for path in ("/health/ready", "/health/live"):
        r = t.server.get(path)
        res.observations[path] = {"status": r.status_code, "body": r.text[:500]}
        if r.status_code == 404:
            res.skip(f"server has no {path}")
            continue
        res.expect(r.status_code == 200, f"{path} answered {r.status_code}, expected 200 on a loaded server")
    return res


def bundle_identity(t: Target, expected: str) -> CheckResult:
    """The server serves the bundle the caller deployed: /v1/bundle and every metric label agree."""
    res = CheckResult("bundle_identity")
    got = (t.bundle or {}).get("bundle_id")
    m = scrape(t.server)
    labels = sorted(m.label_values("modeldeploy_build_info", "bundle")) if m else []
    res.observations.update(expected=expected, bundle_endpoint=got, metric_bundle_labels=labels)
    res.expect(got == expected, f"/v1/bundle reports bundle {got!r}, expected {expected!r}")
    res.expect(labels == [expected], f"metrics carry bundle labels {labels}, expected only {expected!r}")
    return res


def _common(res: CheckResult, body: Any, obj: str, model: str, where: str) -> None:
    res.expect(isinstance(body, dict), f"{where}: body is not a JSON object")
    if not isinstance(body, dict):
        return
    res.expect(isinstance(body.get("id"), str) and body["id"] != "", f"{where}: id missing or not a string")
    res.expect(body.get("object") == obj, f"{where}: object is {body.get('object')!r}, expected {obj!r}")
    res.expect(isinstance(body.get("created"), int), f"{where}: created is not an integer")
    res.expect(body.get("model") == model, f"{where}: model is {body.get('model')!r}, expected {model!r}")


def _usage(res: CheckResult, usage: Any, max_tokens: int, finish: str | None, where: str) -> None:
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    ok = isinstance(usage, dict) and all(isinstance(usage.get(k), int) for k in keys)
    if not res.expect(ok, f"{where}: usage must have integer {', '.join(keys)}, got {usage!r}"):
        return
    res.expect(
        usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"],
        f"{where}: total_tokens != prompt_tokens + completion_tokens ({usage})",
    )
    res.expect(usage["prompt_tokens"] > 0, f"{where}: prompt_tokens must be > 0")
    res.expect(
        usage["completion_tokens"] <= max_tokens, f"{where}: completion_tokens above max_tokens {max_tokens}"
    )
    if finish == "length":
        res.expect(
            usage["completion_tokens"] == max_tokens,
            f"{where}: finish_reason 'length' but "
            f"completion_tokens {usage['completion_tokens']} != {max_tokens}",
        )


def completion(t: Target, max_tokens: int, prompt: Any = PROMPT, **kw: Any) -> httpx.Response:
    body = {"model": t.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **t.extra(), **kw}
    return t.server.post("/v1/completions", body)


def chat(t: Target, max_tokens: int, **kw: Any) -> httpx.Response:
    body = {
        "model": t.model,
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0,
        **t.extra(),
        **kw,
    }
    return t.server.post("/v1/chat/completions", body)


def normal_response(t: Target) -> CheckResult:
    res = CheckResult("normal_response")
    r = completion(t, 8)
    res.observations["completion"] = {"status": r.status_code, "body": _safe_json(r)}
    if res.expect(r.status_code == 200, f"/v1/completions answered {r.status_code}: {r.text[:300]}"):
        b = r.json()
        _common(res, b, "text_completion", t.model, "completion")
        ch = b.get("choices") or [None]
        res.expect(len(ch) == 1 and isinstance(ch[0], dict), "completion: expected exactly one choice")
        c0 = ch[0]
        if isinstance(c0, dict):
            res.expect(c0.get("index") == 0, "completion: choices[0].index != 0")
            res.expect(isinstance(c0.get("text"), str), "completion: choices[0].text is not a string")
            res.expect(
                c0.get("finish_reason") in ("stop", "length"),
                f"completion: finish_reason {c0.get('finish_reason')!r} not in stop/length",
            )
            _usage(res, b.get("usage"), 8, c0.get("finish_reason"), "completion")
    r = chat(t, 8)
    res.observations["chat"] = {"status": r.status_code, "body": _safe_json(r)}
    if res.expect(r.status_code == 200, f"/v1/chat/completions answered {r.status_code}: {r.text[:300]}"):
        b = r.json()
        _common(res, b, "chat.completion", t.model, "chat")
        ch = b.get("choices") or [None]
        res.expect(len(ch) == 1 and isinstance(ch[0], dict), "chat: expected exactly one choice")
        c0 = ch[0]
        if isinstance(c0, dict):
            msg = c0.get("message") or {}
            res.expect(msg.get("role") == "assistant", "chat: message.role is not 'assistant'")
            res.expect(isinstance(msg.get("content"), str), "chat: message.content is not a string")
            res.expect(
                c0.get("finish_reason") in ("stop", "length"), "chat: finish_reason not in stop/length"
            )
            _usage(res, b.get("usage"), 8, c0.get("finish_reason"), "chat")
    return res


def read_stream(
    t: Target, path: str, body: dict[str, Any], stop_after_first_delta: bool = False
) -> dict[str, Any]:
    """POST a streaming request; returns status, parsed events, and whether we hung up early."""
    client = t.server.new_client()
    events: list[Any] = []
    rec: dict[str, Any] = {"status": None, "events": events, "content_type": None, "hung_up": False}
    try:
        with client.stream("POST", path, json=body) as r:
            rec["status"], rec["content_type"] = r.status_code, r.headers.get("content-type", "")
            if r.status_code != 200:
                r.read()
                rec["error"] = r.text[:500]
                return rec
            for ev in iter_sse(r.iter_lines()):
                if ev.data == "[DONE]":
                    events.append("[DONE]")
                    continue
                try:
                    events.append(ev.json())
                except ValueError:
                    events.append({"unparsable": ev.data[:200]})
                if stop_after_first_delta and _delta_text(events[-1]):
                    rec["hung_up"] = True
                    break  # leaving the block closes the connection mid-stream
    finally:
        client.close()
    return rec


def _delta_text(chunk: Any) -> str:
    if not isinstance(chunk, dict) or not chunk.get("choices"):
        return ""
    c = chunk["choices"][0]
    return (c.get("delta") or {}).get("content") or c.get("text") or ""


def streaming(t: Target) -> CheckResult:
    res = CheckResult("streaming")
    r = chat(t, 12)
    if not res.expect(r.status_code == 200, f"baseline chat answered {r.status_code}"):
        return res
    base = r.json()
    base_text = base["choices"][0]["message"]["content"]
    body = {
        "model": t.model,
        "messages": MESSAGES,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **t.extra(),
    }
    rec = read_stream(t, "/v1/chat/completions", body)
    ev = rec["events"]
    res.observations["chat_stream"] = {
        "status": rec["status"],
        "content_type": rec["content_type"],
        "events": len(ev),
        "first": ev[:2],
        "last": ev[-3:],
    }
    if not res.expect(rec["status"] == 200, f"stream answered {rec['status']}: {rec.get('error')}"):
        return res
    res.expect(rec["content_type"].startswith("text/event-stream"), f"content-type {rec['content_type']!r}")
    res.expect(bool(ev) and ev[-1] == "[DONE]", "stream must end with data: [DONE]")
    res.expect(ev.count("[DONE]") == 1, "[DONE] must appear exactly once")
    chunks = [e for e in ev if e != "[DONE]"]
    res.expect(
        all(isinstance(c, dict) and c.get("object") == "chat.completion.chunk" for c in chunks),
        "every chunk must have object 'chat.completion.chunk'",
    )
    res.expect(len({c.get("id") for c in chunks if isinstance(c, dict)}) == 1, "chunks must share one id")
    with_choices = [c for c in chunks if isinstance(c, dict) and c.get("choices")]
    if res.expect(bool(with_choices), "no chunk carried choices"):
        res.expect(
            (with_choices[0]["choices"][0].get("delta") or {}).get("role") == "assistant",
            "first chunk's delta must carry role 'assistant'",
        )
        finishes = [i for i, c in enumerate(with_choices) if c["choices"][0].get("finish_reason")]
        res.expect(
            finishes == [len(with_choices) - 1],
            f"finish_reason must be set exactly once, on the last choice chunk (at {finishes})",
        )
    usage_chunks = [c for c in chunks if isinstance(c, dict) and c.get("usage")]
    if res.expect(
        len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and usage_chunks[0].get("choices") == [],
        "include_usage: exactly one final chunk with usage and empty choices",
    ):
        u = usage_chunks[0]["usage"]
        res.expect(u == base.get("usage"), f"stream usage {u} != non-stream usage {base.get('usage')}")
    text = "".join(_delta_text(c) for c in chunks)
    res.observations["reconstructed"] = {"stream": text, "non_stream": base_text}
    res.expect(text == base_text, "concatenated deltas differ from the non-streaming greedy answer")
    res.caveats.append(
        "reconstruction compares greedy (temperature 0) outputs; it assumes a deterministic engine"
    )
    # completions stream without include_usage: no usage values, text reconstructs
    rc = completion(t, 10)
    rec = read_stream(
        t,
        "/v1/completions",
        {"model": t.model, "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "stream": True, **t.extra()},
    )
    chunks = [e for e in rec["events"] if e != "[DONE]"]
    res.observations["completion_stream"] = {"status": rec["status"], "events": len(rec["events"])}
    if res.expect(rec["status"] == 200 and rc.status_code == 200, "completion stream/baseline failed"):
        res.expect(rec["events"][-1:] == ["[DONE]"], "completion stream must end with [DONE]")
        res.expect(
            all(isinstance(c, dict) and c.get("object") == "text_completion" for c in chunks),
            "completion chunks must have object 'text_completion'",
        )
        res.expect(
            not any(isinstance(c, dict) and c.get("usage") for c in chunks),
            "usage sent although stream_options.include_usage was not set",
        )
        res.expect(
            "".join(_delta_text(c) for c in chunks) == rc.json()["choices"][0]["text"],
            "completion stream text differs from the non-streaming answer",
        )
    return res


def usage(t: Target) -> CheckResult:
    res = CheckResult("usage_accounting")
    before, _ = t.wait_metrics(lambda m: (m.get("modeldeploy_requests_running") or 0) == 0, timeout_s=5.0)
    r = completion(t, 5)
    after = t.metrics()
    if not res.expect(r.status_code == 200, f"completion answered {r.status_code}"):
        return res
    b = r.json()
    u, finish = b.get("usage"), b["choices"][0].get("finish_reason")
    res.observations["usage"], res.observations["finish_reason"] = u, finish
    _usage(res, u, 5, finish, "usage")
    if t.is_modeldeploy:
        res.expect(finish == "length", f"with ignore_eos the answer must stop on length, got {finish!r}")
    if before is None or after is None:
        res.caveats.append("server exposes no modeldeploy metrics: usage not cross-checked with counters")
        return res
    d_gen = (after.get("modeldeploy_generation_tokens_total") or 0) - (
        before.get("modeldeploy_generation_tokens_total") or 0
    )
    idle = all((m.get("modeldeploy_requests_running") or 0) == 0 for m in (before, after))
    res.observations["generation_tokens_delta"] = d_gen
    if idle and isinstance(u, dict):
        res.expect(
            d_gen == u.get("completion_tokens"),
            f"modeldeploy_generation_tokens_total grew by {d_gen}, usage says {u.get('completion_tokens')}",
        )
    else:
        res.caveats.append("other requests were running: counter delta not compared")
    return res


def stop_sequences(t: Target) -> CheckResult:
    res = CheckResult("stop_sequences")
    r = completion(t, 24)
    if not res.expect(r.status_code == 200, f"baseline answered {r.status_code}"):
        return res
    full = r.json()["choices"][0]["text"]
    sub = next(
        (
            full[k : k + 3]
            for k in range(len(full) // 3, len(full) - 3)
            if "\ufffd" not in full[k : k + 3] and full[k : k + 3].strip()
        ),
        None,
    )
    res.observations["baseline"] = full
    if sub is None:
        res.skip(f"baseline output too short to pick a stop sequence: {full!r}")
        return res
    expected = full[: full.find(sub)]
    r = completion(t, 24, stop=[sub])
    res.observations.update(stop=sub, expected=expected, status=r.status_code)
    if res.expect(r.status_code == 200, f"stop request answered {r.status_code}: {r.text[:300]}"):
        c = r.json()["choices"][0]
        res.observations["got"] = c.get("text")
        res.expect(
            c.get("text") == expected, f"text with stop {sub!r} is {c.get('text')!r}, expected {expected!r}"
        )
        res.expect(
            c.get("finish_reason") == "stop", f"finish_reason {c.get('finish_reason')!r}, expected 'stop'"
        )
    return res


def errors(t: Target) -> CheckResult:
    res = CheckResult("error_handling")
    cases = [
        (
            "unsupported_parameter",
            {"model": t.model, "prompt": "hi", "max_tokens": 2, UNSUPPORTED: 1},
            None,
            400,
        ),
        ("wrong_type", {"model": t.model, "prompt": "hi", "max_tokens": "two"}, None, 400),
        ("context_overflow", {"model": t.model, "prompt": "hi", "max_tokens": 10**9}, None, 400),
        ("unknown_model", {"model": t.model + "-does-not-exist", "prompt": "hi", "max_tokens": 2}, None, 404),
        ("invalid_json", None, b'{"model": ', 400),
    ]
    for name, body, raw, want in cases:
        r = t.server.post("/v1/completions", body, content=raw)
        err = error_field(r)
        res.observations[name] = {"status": r.status_code, "error": err}
        res.expect(r.status_code == want, f"{name}: status {r.status_code}, expected {want}")
        res.expect(
            isinstance(err.get("message"), str) and err.get("message") != "",
            f"{name}: body is not an OpenAI error object: {r.text[:200]}",
        )
        if name == "unsupported_parameter":
            res.expect(
                err.get("param") == UNSUPPORTED or UNSUPPORTED in str(err.get("message")),
                f"unsupported parameter not named in the error: {err}",
            )
            res.expect(err.get("type") == "invalid_request_error", f"error.type {err.get('type')!r}")
        if name == "wrong_type":
            res.expect(
                "max_tokens" in f"{err.get('param')} {err.get('message')}", "wrong_type: max_tokens not named"
            )
    return res


CANCEL_TOKENS = (256, 1024, 4096)  # what each try of the cancellation check asks for


def _completed(m) -> float:
    return m.get("modeldeploy_requests_total", outcome="completed") or 0.0


def cancel_sizes(max_model_len: int | None) -> list[int]:
    """max_tokens of each cancellation try: longer each time, within the context when it is known
    (256 tokens left for the prompt); one try of 256 when it is not (a longer ask may be a 400)."""
    if max_model_len is None:
        return [CANCEL_TOKENS[0]]
    cap = max(16, max_model_len - 256)
    return [min(n, cap) for n in CANCEL_TOKENS]


def cancellation(t: Target) -> CheckResult:
    """Hang up after the first content delta; the server must count the request cancelled and free
    its slot. A fast server can finish the whole stream before a busy client's hang-up reaches it
    (256 tokens of a tiny model take 0.2 s on one CPU; the operator's gate shares its process with
    reconciles): that try proves nothing either way, so the next asks for more tokens. Only a server
    that completed every try, or that neither cancelled nor completed it, fails."""
    res = CheckResult("cancellation")
    tries: list[dict[str, Any]] = []
    res.observations["tries"] = tries
    m, base, outran = None, 0.0, False
    for max_tokens in cancel_sizes(t.max_model_len):
        before = t.metrics()
        body = {
            "model": t.model,
            "messages": MESSAGES,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            **t.extra(),
        }
        rec = read_stream(t, "/v1/chat/completions", body, stop_after_first_delta=True)
        one: dict[str, Any] = {
            "max_tokens": max_tokens,
            "client": {
                "status": rec["status"],
                "events_read": len(rec["events"]),
                "hung_up_after_first_delta": rec["hung_up"],
            },
        }
        tries.append(one)
        if not res.expect(rec["status"] == 200, f"stream answered {rec['status']}: {rec.get('error')}"):
            return res
        if not res.expect(
            rec["hung_up"], "the stream finished before its first content delta; nothing to cancel"
        ):
            return res
        if before is None:
            res.caveats.append("server exposes no modeldeploy metrics: cancellation checked client-side only")
            return res
        base, done = _cancelled(before), _completed(before)
        m, waited = t.wait_metrics(
            lambda m, base=base, done=done: (
                (_cancelled(m) >= base + 1 or _completed(m) >= done + 1)
                and (m.get("modeldeploy_requests_running") or 0) == 0
            )
        )
        outran = m is not None and _cancelled(m) < base + 1 and _completed(m) >= done + 1
        one["server"] = {
            "cancelled_before": base,
            "cancelled_after": _cancelled(m) if m else None,
            "completed_before_hang_up": outran,
            "seconds_until_seen": round(waited, 3),
            "running_after": m.get("modeldeploy_requests_running") if m else None,
            "kv_cache_usage_after": m.get("modeldeploy_kv_cache_usage_ratio") if m else None,
        }
        if not outran:
            break
    if outran:
        res.expect(
            False,
            f"the server completed each of {len(tries)} streams (up to {tries[-1]['max_tokens']} tokens) "
            "before the client's hang-up reached it: cancellation not observed",
        )
        return res
    res.expect(
        m is not None and _cancelled(m) >= base + 1,
        "modeldeploy_requests_total{outcome=cancelled} did not grow after the client hung up",
    )
    res.expect(
        m is not None and (m.get("modeldeploy_requests_running") or 0) == 0,
        "the cancelled request still holds a running slot",
    )
    return res


def _safe_json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text[:500]
