"""The local Kubernetes cluster for tests and demos (see local.py, build.sh, and e2e/conftest.py)."""

from modeldeploy_dev.cluster.local import LocalCluster, Settings

__all__ = ["LocalCluster", "Settings"]
