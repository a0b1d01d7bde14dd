"""The operator's gate credential: how its gates ask a pod that requires an API key.

The operator never reads Secrets, so it cannot send a ModelDeployment's API key. Instead it holds a
key of its own (env MODELDEPLOY_GATE_KEY; the chart fills it from a Secret through `secretKeyRef`,
which the kubelet resolves) and derives one token per ModelDeployment from it. The pods of a keyed
ModelDeployment get only the token's sha256 (env MODELDEPLOY_GATE_KEY_SHA256), so:
- anyone who can read the pod spec sees a digest, which asks nothing;
- a canary receives its own ModelDeployment's token with each gate request, which opens only the
  pods it could already reach with the API key it is given, never another ModelDeployment's;
- the digest depends on the object's uid, so a ModelDeployment deleted and created again under the
  same name gets a new token.
The digest is written into every keyed pod while the operator has a key, gates or not, so that a
gate turned on later finds the stable pods ready for it. Giving an operator its first key, or
rotating it, changes the current bundle's pod template: those pods roll once (a Deployment rolling
update, not a canary).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

from modeldeploy.operator.rollout.children import GATE_KEY_ENV as ENV

MIN_LENGTH = 32  # characters: a short operator key would make every derived token guessable


@dataclass(frozen=True)
class GateKey:
    """The operator's key; `token(...)` for its gates, `digest(...)` for the pod spec."""

    secret: bytes

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> GateKey | None:
        """None when unset (keyed ModelDeployments with gates are then refused, with the reason)."""
        raw = env.get(ENV, "").strip()
        if not raw:
            return None
        if len(raw) < MIN_LENGTH:
            raise ValueError(f"env {ENV}: at least {MIN_LENGTH} characters, got {len(raw)}")
        return cls(raw.encode())

    def token(self, namespace: str, name: str, uid: str) -> str:
        msg = f"modeldeploy-gate/v1\n{namespace}\n{name}\n{uid}".encode()
        return hmac.new(self.secret, msg, hashlib.sha256).hexdigest()

    def digest(self, namespace: str, name: str, uid: str) -> str:
        return hashlib.sha256(self.token(namespace, name, uid).encode()).hexdigest()
