"""The built-in evaluation set is one the default model passes, on our engine, through the gate's
own client: every item answered right, greedily. (The gate against itself, and against bad and
harmless variants, is bench/quality_gate.py's; that costs minutes, this one pass.)

If the engine, the chat template handling or an item drifts, the default gate would start failing
every rollout; this test says so first, with the item and the answer."""

from __future__ import annotations

from modeldeploy.operator.analysis.quality import Cohort, _Client, resolve
from modeldeploy.operator.analysis.quality_checks import check
from modeldeploy.operator.api.v1alpha1.quality import Quality
from modeldeploy.runtime import EngineConfig
from modeldeploy.runtime.server.config import ServerConfig
from modeldeploy_dev.harness import ThreadedServer


def test_the_real_model_passes_every_builtin_item(real_model_dir):
    ecfg = EngineConfig(model=str(real_model_dir), dtype="float32", max_model_len=4096, num_kv_blocks=640)
    es = resolve(Quality())
    with ThreadedServer(ServerConfig(engine=ecfg, served_model_name="smollm2"), timeout_s=300) as s:
        client = _Client(Cohort(s.url), 300)
        try:
            answers = [client.answer(item) for item in es.items]
        finally:
            client.close()
        wrong = [
            (it.chat()[-1]["content"][-80:], a)
            for it, (a, _, _) in zip(es.items, answers, strict=True)
            if not check(it, a)[0]
        ]
        assert not wrong, f"{len(wrong)} of {len(es.items)} built-in items answered wrong: {wrong}"
