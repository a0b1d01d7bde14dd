"""The inference engine: continuous batching over a paged KV cache, one step at a time.

`LLMEngine` (llm_engine) is the step: schedule, one forward, sample, detokenize. `LLM` (llm) drives
it offline, the engine clients (`client`) for the HTTP server, on a thread or in a process of its own.
Packages, lowest first:
- the shared types at this level: `sampling_params`, `output`, `request_check`, `detokenizer` and
  `heap`, which import nothing of the engine;
- `core`: sequences, the block manager and its prefix cache, the scheduler, the KV cache's size;
- `sample` (the sampler), `structured_output` (grammars) and `lora` (adapter residency);
- `worker`: the model runner and its decode paths;
- `parallel`: the tensor-parallel ranks;
- `llm_engine`, then `llm` and `client` on top.
The import contract `engine-layers` (pyproject's `[tool.importlinter]`) holds each to its layer, so no
two of them import each other. Nothing is imported here: `modeldeploy.runtime` exports lazily.
"""
