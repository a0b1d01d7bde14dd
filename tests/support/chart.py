"""The operator chart's folder and the helm binary `make cluster-build` compiles (None before it)."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

CHART = Path(__file__).resolve().parents[2] / "charts" / "modeldeploy-operator"


def helm() -> str | None:
    found = sorted(glob.glob(os.path.expanduser("~/.cache/modeldeploy/helm-*/helm")))
    return found[-1] if found else shutil.which("helm")
