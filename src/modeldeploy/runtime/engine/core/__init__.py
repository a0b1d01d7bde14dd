"""The scheduling core: a request's sequences (`sequence`), the KV block manager and its prefix cache
(`block_manager`), the scheduler that builds each step's mixed batch (`scheduler`) and the KV cache's
size and the context it serves (`kv_budget`). No model and no sampler: may import `sampling_params`
and the runtime's config and loader only.
"""
