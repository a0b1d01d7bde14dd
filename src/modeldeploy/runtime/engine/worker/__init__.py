"""The model runner (`model_runner`): one forward over a scheduled batch against the paged KV cache,
its decode fast paths (`graphs`: CUDA graphs; `cpu_decode`: static kernel calls on CPU) and prompt
logprobs (`prompt_logprobs`). May import `core` and `lora`, never `parallel`: rank 0's runner is
handed the other ranks as a `model_runner.Ranks`."""
