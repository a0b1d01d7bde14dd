"""LoRA adapters through the HTTP server: selection by `model`, the model list, the bundle
report, per-adapter metrics, 404 for unknown names, and no adapter load/unload endpoint."""

from __future__ import annotations

import argparse

import httpx
import pytest

from modeldeploy.conformance.prom import Metrics
from modeldeploy.digest import dir_digest
from modeldeploy.runtime import LLM, EngineConfig, SamplingParams
from modeldeploy.runtime.server import cli
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer
from modeldeploy_dev.lora_fixtures import make_adapters

BUNDLE = "bundle-lora-0001"
MESSAGES = [{"role": "user", "content": "Which tenant are you?"}]


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    return make_adapters(llama_dir, tmp_path_factory.mktemp("lora-server"))


@pytest.fixture(scope="module")
def server(llama_dir, adapters):
    pins = [
        {"name": n, "path": str(p), "digest": dir_digest(p), "revision": "r7"} for n, p in adapters.items()
    ]
    ecfg = EngineConfig(
        model=str(llama_dir), device="cpu", dtype="float32", bundle_id=BUNDLE, adapters=pins, max_loras=1
    )
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny")) as s:
        yield s


def chat(s, model: str, max_tokens: int = 8) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60)


def test_each_adapter_answers_under_its_name_as_offline_peft_equal_engine(server, llama_dir, adapters):
    answers = {}
    for name in ("tiny", "tenant-a", "tenant-b"):
        r = chat(server, name)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == name
        answers[name] = r.json()["choices"][0]["message"]["content"]
    assert len(set(answers.values())) == 3, answers
    # Same tokens as the offline engine for the same adapter (the engine equals transformers + peft).
    llm = LLM(
        llama_dir,
        dtype="float32",
        device="cpu",
        adapters=[{"name": "tenant-b", "path": str(adapters["tenant-b"])}],
    )
    ids = server.ctx.encode_chat(MESSAGES)
    want = llm.generate(ids, SamplingParams(temperature=0, max_tokens=8), adapter="tenant-b")[0].text
    assert answers["tenant-b"] == want


def test_unknown_model_is_404_naming_the_served_models(server):
    r = chat(server, "tenant-c")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "'tiny', 'tenant-a', 'tenant-b'" in err["message"]


def test_models_lists_base_and_adapters_with_parent(server):
    data = httpx.get(server.url + "/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in data] == [
        ("tiny", None),
        ("tenant-a", "tiny"),
        ("tenant-b", "tiny"),
    ]
    assert all(m["root"] == "tiny" for m in data)


def test_bundle_reports_adapters_and_resident_set(server):
    chat(server, "tenant-a")
    b = httpx.get(server.url + "/v1/bundle").json()
    assert [(a["name"], a["revision"]) for a in b["adapters"]] == [("tenant-a", "r7"), ("tenant-b", "r7")]
    assert all(a["digest"].startswith("sha256:") for a in b["adapters"])
    assert b["lora"]["max_loras"] == 1 and b["lora"]["resident"] == ["tenant-a"]
    assert b["engine_config"]["max_loras"] == 1
    assert [a["resident"] for a in b["adapters"]] == [True, False]


def test_metrics_carry_the_adapter_label_and_residency(server):
    before = Metrics(httpx.get(server.url + "/metrics").text)
    assert chat(server, "tenant-b").status_code == 200
    assert chat(server, "nope").status_code == 404
    m = Metrics(httpx.get(server.url + "/metrics").text)

    def delta(**labels):
        return (m.get("modeldeploy_requests_total", **labels) or 0) - (
            before.get("modeldeploy_requests_total", **labels) or 0
        )

    assert delta(adapter="tenant-b", outcome="completed") == 1
    assert delta(adapter="", outcome="invalid") == 1  # an unknown name is nobody's adapter
    assert delta(adapter="tenant-a") == 0
    assert m.get("modeldeploy_time_to_first_token_seconds_count", adapter="tenant-b", bundle=BUNDLE) >= 1
    assert m.get("modeldeploy_lora_resident", adapter="tenant-b") == 1
    assert m.get("modeldeploy_lora_resident", adapter="tenant-a") == 0  # one slot: B evicted A
    assert m.get("modeldeploy_lora_loads_total") >= 1


def test_no_adapter_load_or_unload_endpoint(server):
    """Adapters are staged with the bundle; vLLM's runtime-loading endpoints must not exist."""
    paths = {getattr(r, "path", "") for r in server.app.routes}
    assert not [p for p in paths if "lora" in p.lower() or "adapter" in p.lower() or "load" in p.lower()]
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/adapters", "/v1/lora_adapters"):
        r = httpx.post(server.url + path, json={"lora_name": "x", "lora_path": "/tmp"})
        assert r.status_code in (404, 405), (path, r.status_code)
    assert chat(server, "x").status_code == 404  # nothing got loaded


def _args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.configure(p)
    argv = ["--model", "/m"]
    for k, v in kw.items():
        for item in v if isinstance(v, list) else [v]:
            argv += [f"--{k.replace('_', '-')}", str(item)]
    return p.parse_args(argv)


def test_cli_flags_build_adapter_pins():
    cfg = cli.build_config(
        _args(
            adapter=["a=/x", "b=/y"],
            adapter_digest="b=sha256:" + "1" * 64,
            adapter_revision="a=v2",
            max_loras=3,
        )
    )
    assert cfg.engine.adapters == [
        {"name": "a", "path": "/x", "revision": "v2"},
        {"name": "b", "path": "/y", "digest": "sha256:" + "1" * 64},
    ]
    assert cfg.engine.max_loras == 3


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"adapter": "a"}, "--adapter: expected NAME=VALUE"),
        ({"adapter": ["a=/x", "a=/y"]}, "--adapter: 'a' is given twice"),
        ({"adapter": "a=/x", "adapter_digest": "b=sha256:1"}, "--adapter-digest: 'b' is not an --adapter"),
        ({"adapter": "m=/x", "served_model_name": "m"}, "--adapter: 'm' is also the served model name"),
    ],
)
def test_cli_adapter_errors_name_the_flag(kw, message):
    with pytest.raises(ValueError, match=message):
        cli.build_config(_args(**kw))


def test_conformance_suite_passes_with_adapters(server):
    from modeldeploy.conformance import ConformanceConfig, run_conformance

    report = run_conformance(
        ConformanceConfig(url=server.url, requests=4, concurrency=2, expect_bundle=BUNDLE)
    )
    assert report.passed, report.table()
    check = next(c for c in report.checks if c.name == "adapters")
    assert check.verdict == "pass" and check.observations["adapters"] == ["tenant-a", "tenant-b"]
    assert check.observations["unknown"]["status"] == 404
    texts = {check.observations[k]["text"] for k in ("base", "tenant-a", "tenant-b")}
    assert len(texts) == 3


def test_conformance_fails_an_adapter_that_changes_nothing(llama_dir, tmp_path):
    """PEFT's default init (B = 0) is the base model: the adapters check must catch it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from modeldeploy.conformance import ConformanceConfig, run_conformance
    from modeldeploy.conformance.suite import CHECKS

    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(
        tmp_path / "noop"
    )
    ecfg = EngineConfig(
        model=str(llama_dir),
        device="cpu",
        dtype="float32",
        adapters=[{"name": "noop", "path": str(tmp_path / "noop")}],
    )
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="tiny")) as s:
        # Every per-request series exists before the first request, for the base and each adapter:
        # the operator's scrape reads a pod without them as one serving another bundle.
        fresh = Metrics(httpx.get(s.url + "/metrics").text)
        for adapter in ("", "noop"):
            assert fresh.get("modeldeploy_time_to_first_token_seconds_count", adapter=adapter) == 0
            assert fresh.get("modeldeploy_requests_total", adapter=adapter, outcome="completed") == 0
        report = run_conformance(ConformanceConfig(url=s.url, skip=[c for c in CHECKS if c != "adapters"]))
    assert not report.passed
    assert "adapter 'noop' answered exactly as the base model" in report.checks[0].failures[0]
