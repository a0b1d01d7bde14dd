"""Adapter residency: every pinned adapter in host memory, `max_loras` of them on the device.

Adapters are fixed at start (pinned parts of the bundle, digests verified like the model's;
there is no load or unload at run time). Each has an id (its index in the configured list,
-1 = the base model). A step asks `prepare(ids)` for the device slots of the adapters its
sequences use; adapters not resident are copied in over the least recently used slots that
this step does not need. The scheduler never runs more distinct adapters at once than there
are slots, so a step's set always fits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import torch

from modeldeploy.digest import dir_digest, verify
from modeldeploy.runtime.models.llama import ModelArgs
from modeldeploy.runtime.models.lora import SITE_OF, SITES, Adapter, LoraSlots, read_adapter


class AdapterPool:
    def __init__(
        self,
        pins: list[dict],
        args: ModelArgs,
        dtype: torch.dtype,
        device: torch.device,
        max_loras: int,
        progress: Callable[[str, float], None] = lambda p, f: None,
    ):
        self.pins = [dict(p) for p in pins]
        self.adapters: list[Adapter] = []
        for i, pin in enumerate(self.pins):
            progress(f"verifying adapter {pin['name']}", 0.9 + 0.02 * i / len(pins))
            if pin.get("digest"):
                verify(Path(pin["path"]), pin["digest"])
            else:  # unpinned (local use): report what was served
                pin["digest"] = dir_digest(pin["path"])
            adapter = read_adapter(pin["name"], pin["path"], args, dtype)
            if device.type == "cuda":  # pinned host memory: slot writes copy asynchronously
                adapter.weights = {
                    k: (a.pin_memory(), b.pin_memory()) for k, (a, b) in adapter.weights.items()
                }
            self.adapters.append(adapter)
        self.ids = {a.name: i for i, a in enumerate(self.adapters)}
        self.num_slots = min(max_loras, len(self.adapters))
        self.rank = max(a.rank for a in self.adapters)
        used = {SITE_OF[t] for a in self.adapters for t in a.targets}
        self.sites = tuple(s for s in SITES if s in used)
        self.slot_bytes = LoraSlots.slot_bytes(args, self.rank, self.sites, dtype)
        self._args, self._dtype, self._device = args, dtype, device
        self.slots: LoraSlots | None = None  # allocated by allocate(), after the budget is known
        self.resident: OrderedDict[int, int] = OrderedDict()  # adapter id -> slot, LRU first
        self.loads_total = 0  # host -> device slot writes

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.adapters]

    @property
    def device_bytes(self) -> int:
        """What the device slots take: counted before KV blocks are sized."""
        return self.num_slots * self.slot_bytes

    @property
    def host_bytes(self) -> int:
        return sum(a.nbytes for a in self.adapters)

    def allocate(self) -> None:
        self.slots = LoraSlots(self._args, self.num_slots, self.rank, self.sites, self._dtype, self._device)

    def id_of(self, name: str | None) -> int:
        """Adapter id for a name (None or '' = base, -1); ValueError for an unknown name."""
        if not name:
            return -1
        if name not in self.ids:
            raise ValueError(f"model: unknown adapter {name!r}; adapters: {', '.join(self.ids)}")
        return self.ids[name]

    def prepare(self, ids: set[int]) -> dict[int, int]:
        """Device slot of each adapter id in `ids` (len(ids) <= num_slots), loading as needed."""
        if len(ids) > self.num_slots:
            raise RuntimeError(f"{len(ids)} adapters in one step, only {self.num_slots} slots")
        assert self.slots is not None, "allocate() first"
        for i in ids:
            if i in self.resident:
                self.resident.move_to_end(i)
        for i in sorted(ids - set(self.resident)):
            if len(self.resident) < self.num_slots:
                slot = len(self.resident)
            else:
                victim = next(v for v in self.resident if v not in ids)
                slot = self.resident.pop(victim)
            self.slots.write(slot, self.adapters[i])
            self.resident[i] = slot
            self.loads_total += 1
        return {i: self.resident[i] for i in ids}

    def resident_names(self) -> list[str]:
        # tuple(): one C-level copy, so a server thread reading this while the engine thread
        # loads an adapter never iterates a dict being changed
        return sorted(self.adapters[i].name for i in tuple(self.resident))

    def info(self) -> list[dict]:
        """Per adapter: the pins, what was read, and whether it is on the device now."""
        out, resident = [], set(tuple(self.resident))
        for i, (pin, a) in enumerate(zip(self.pins, self.adapters, strict=True)):
            out.append(
                {
                    "name": a.name,
                    "path": a.path,
                    "revision": pin.get("revision", ""),
                    "digest": pin.get("digest", ""),
                    "rank": a.rank,
                    "alpha": a.alpha,
                    "rslora": a.rslora,
                    "scaling": a.scaling,
                    "targets": list(a.targets),
                    "host_bytes": a.nbytes,
                    "resident": i in resident,
                }
            )
        return out
