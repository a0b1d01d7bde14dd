"""The GPU machine: device, versions, and device-to-device copy bandwidth (read + write bytes/s),
the roofline the other GPU timings are compared with.

    python3 bench/gpu/env.py OUT.json
"""

from __future__ import annotations

import sys

from modeldeploy_dev.gpu_bench import copy_bandwidth, main


def measure() -> dict:
    import torch
    import transformers

    try:
        import cupy

        cupy_version = cupy.__version__
    except ImportError:
        cupy_version = "not installed"
    p = torch.cuda.get_device_properties(0)
    return {
        "device": p.name,
        "devices": torch.cuda.device_count(),
        "sms": p.multi_processor_count,
        "memory_gib": p.total_memory / 2**30,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cupy": cupy_version,
        "transformers": transformers.__version__,
        "copy_bytes_per_s": copy_bandwidth(),
    }


if __name__ == "__main__":
    sys.exit(main(measure))
