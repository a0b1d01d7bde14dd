"""The HTTP server on CUDA with the engine core in a spawned process of its own gives the same
greedy completion as with the engine core on a thread of the server process."""

from __future__ import annotations


def test_process_core_equals_thread_core(tiny_model):
    from modeldeploy.runtime import EngineConfig
    from modeldeploy.runtime.server.config import ServerConfig
    from modeldeploy_dev.harness import ThreadedServer

    d = tiny_model("llama", 0, hidden_size=256, num_heads=4, num_kv_heads=2)
    body = {"model": "bench", "prompt": "The quick brown fox", "max_tokens": 32, "temperature": 0}
    texts, layouts = {}, {}
    for layout in ("process", "thread"):
        engine = EngineConfig(model=str(d), device="cuda", dtype="float32", max_num_seqs=8, bundle_id="gpu")
        cfg = ServerConfig(engine=engine, served_model_name="bench", max_queue=64, engine_core=layout)
        with ThreadedServer(cfg, timeout_s=90) as srv:
            layouts[layout] = srv.client().get("/v1/bundle").json()["engine_info"]["engine_core"]["layout"]
            texts[layout] = srv.client().post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert layouts == {"process": "process", "thread": "thread"}
    assert texts["process"] == texts["thread"]
