"""The real worker node of the local cluster (opt-in: `modeldeploy cluster up --real-node`).

kubelet and kube-proxy from the pinned Kubernetes module, containerd v2 from its module, Debian's
runc and CNI plugins, a pause image built from pause.c; see node.py for the lifecycle, config.py
for every setting this machine forces, cleanup.py for what `down` proves it removed.
"""

from modeldeploy_dev.cluster.realnode.config import NodeNet
from modeldeploy_dev.cluster.realnode.node import NodeBinaries, RealNode

__all__ = ["NodeBinaries", "NodeNet", "RealNode"]
