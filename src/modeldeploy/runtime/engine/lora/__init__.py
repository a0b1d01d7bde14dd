"""LoRA adapter residency (`pool`): every pinned adapter in host memory, `max_loras` of them in device
slots. The adapter format and the per-token apply are the model's (runtime/models/lora.py). Imports
nothing else of the engine."""
