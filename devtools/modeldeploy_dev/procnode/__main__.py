"""`python -m modeldeploy_dev.procnode`: run the process node (started by `modeldeploy cluster up`)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from kubernetes import config
from modeldeploy_dev.procnode.net import Network
from modeldeploy_dev.procnode.node import ProcessNode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeldeploy_dev.procnode", description=__doc__)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--node", default="proc-0")
    p.add_argument("--bridge", default="mdbr0")
    p.add_argument("--pod-cidr", default="10.244.0.0/24")
    p.add_argument("--state-dir", required=True, type=Path)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    api = config.new_client_from_config(config_file=a.kubeconfig)
    ProcessNode(api, a.node, Network(a.bridge, a.pod_cidr), a.state_dir).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
