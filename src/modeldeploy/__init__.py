"""modeldeploy: pinned LLM serving bundles, rolled out safely on Kubernetes.

Subpackages: `modeldeploy.operator` (kopf, no torch), `modeldeploy.runtime` (engine + server),
`modeldeploy.kernels` (CuPy kernels with torch twins), `modeldeploy.conformance` (HTTP clients).
"""

__version__ = "0.1.0"
