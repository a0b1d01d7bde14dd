"""Helpers every ModelDeployment API module shares: CEL rules, regex checks, quantities, counts.

Kept apart so the type modules (bundle, topology, analysis, rollout) build on one
set of checks without importing each other; this module imports none of them. A CEL rule made
by `_cel` and the pydantic check beside it must say the same thing: the CRD is generated from both.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import AfterValidator, Field

PERCENT_RE = r"^(100|[1-9][0-9]?)%$"
MSG_COUNT_OR_PERCENT = "must be a count (an integer >= 0) or a percentage of spec.replicas such as '25%'"


def _cel(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": rule, "message": message, **extra}]}


def _matches(pattern: str, message: str):
    def check(v: str) -> str:
        if not re.match(pattern, v):
            raise ValueError(f"{message} (got {v!r})")
        return v

    return AfterValidator(check)


# A Kubernetes quantity ("4Gi", "500m", 2): int-or-string in the CRD.
Quantity = int | str
_QUANTITY_RE = re.compile(
    r"^([+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E))?$"
)
_SUFFIX = MappingProxyType(
    {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
    | {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
)


def quantity_bytes(q: Quantity) -> int:
    """A byte quantity ("140Gi", "80G", "1.5Ti", 2**30) as whole bytes (rounded up); ValueError otherwise."""
    if isinstance(q, bool):
        raise ValueError(f"not a quantity: {q!r}")
    if isinstance(q, int):
        if q < 0:
            raise ValueError(f"a byte quantity must not be negative, got {q}")
        return q
    m = _QUANTITY_RE.match(q.strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity (e.g. 8Gi, 80G): {q!r}")
    number, exponent, suffix = m.groups()
    value = Decimal(number + (exponent or "")) * _SUFFIX[suffix or ""]
    return int(value.to_integral_value(rounding=ROUND_CEILING))


_ANY_QUANTITY_RE = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(n|u|m|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E))?$"
)
_SUBUNIT = MappingProxyType({"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3")})


def quantity_value(q: Quantity) -> Decimal:
    """Any Kubernetes quantity ("500m", "4Gi", "1e3", 2) as an exact Decimal; ValueError otherwise.

    Exact, so two spellings of one value ("0.5" and "500m") compare equal and no rounding hides a
    difference; `quantity_bytes` is the byte-only, rounded-up reading.
    """
    if isinstance(q, bool):
        raise ValueError(f"not a quantity: {q!r}")
    if isinstance(q, int):
        return Decimal(q)
    m = _ANY_QUANTITY_RE.match(q.strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {q!r}")
    number, exponent, suffix = m.groups()
    scale = _SUBUNIT[suffix] if suffix in _SUBUNIT else Decimal(_SUFFIX[suffix or ""])
    return Decimal(number + (exponent or "")) * scale


def _check_bytes(v: Quantity | None) -> Quantity | None:
    if v is not None:
        quantity_bytes(v)
    return v


ByteQuantity = Annotated[Quantity, AfterValidator(_check_bytes)]


def _check_count_or_percent(v: int | str) -> int | str:
    if (
        isinstance(v, bool)
        or (isinstance(v, int) and v < 0)
        or (isinstance(v, str) and not re.match(PERCENT_RE, v))
    ):
        raise ValueError(f"{MSG_COUNT_OR_PERCENT} (got {v!r})")
    return v


# A replica count or a percentage of spec.replicas (rounded up): int-or-string in the CRD.
CountOrPercent = Annotated[
    int | str,
    AfterValidator(_check_count_or_percent),
    Field(
        # maxLength bounds the string side: without it the API server's CEL cost estimate for the regex
        # (a string of any length, in each of 20 steps) exceeds its budget and it rejects the CRD
        json_schema_extra={
            "maxLength": 4,
            **_cel(
                f"type(self) == string ? self.matches('{PERCENT_RE}') : int(self) >= 0", MSG_COUNT_OR_PERCENT
            ),
        }
    ),
]


def resolve_count(v: int | str, total: int) -> int:
    """A CountOrPercent against spec.replicas: a percentage rounds up, like a PodDisruptionBudget's."""
    if isinstance(v, str):
        return math.ceil(total * int(v[:-1]) / 100)
    return v
