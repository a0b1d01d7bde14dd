"""Base of the ModelDeployment API models: camelCase on the wire, unknown fields rejected."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error, not ignored."""

    model_config = ConfigDict(
        alias_generator=lambda s: re.sub(r"_([a-z])", lambda m: m.group(1).upper(), s),
        populate_by_name=True,
        extra="forbid",
    )
