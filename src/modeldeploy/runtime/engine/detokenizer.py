"""Incremental detokenization and stop strings.

Text is decoded over a sliding window of tokens so multi-byte characters split across
tokens never appear half-made (a trailing U+FFFD means "wait for more tokens"). While a
stop string could still be completing, its possible prefix is held back from the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Detokenizer:
    tokenizer: Any  # a Hugging Face tokenizer
    stop: list[str] = field(default_factory=list)
    text: str = ""  # decoded so far (may include a stop string's first chars)
    emitted: int = 0  # characters already handed out
    prefix_offset: int = 0
    read_offset: int = 0
    stopped: bool = False

    def add(self, token_ids: list[int]) -> None:
        """token_ids: all generated ids so far (the newest at the end)."""
        if self.stopped:
            return
        prefix = self.tokenizer.decode(
            token_ids[self.prefix_offset : self.read_offset], skip_special_tokens=True
        )
        full = self.tokenizer.decode(token_ids[self.prefix_offset :], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
            self._check_stop()

    def _check_stop(self) -> None:
        cut = min((i for i in (self.text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.stopped = True

    def delta(self, final: bool) -> str:
        """Text not yet handed out, holding back a possible stop-string prefix unless final."""
        end = len(self.text)
        if not final and not self.stopped and self.stop:
            hold = max(len(s) for s in self.stop) - 1
            end = max(self.emitted, end - hold)
        out = self.text[self.emitted : end]
        self.emitted = end
        return out
