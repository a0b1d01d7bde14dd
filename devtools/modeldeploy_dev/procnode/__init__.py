"""Process node: test infrastructure standing in for kubelet + container runtime (see node.py)."""
