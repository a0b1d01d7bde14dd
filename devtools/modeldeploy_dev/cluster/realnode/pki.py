"""Client certificates for the node, signed by the cluster CA kwokctl made (pki/ca.crt, ca.key).

kubelet joins as `system:node:<name>` in group `system:nodes`, so the apiserver's Node authorizer
(kwokctl runs `--authorization-mode=Node,RBAC`) gives it exactly a node's rights; kube-proxy is
`system:kube-proxy`, which the default `system:node-proxier` ClusterRoleBinding covers. The
openssl CLI signs them: no bootstrap token, no CSR approval loop to wait for.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def sign_client_cert(
    ca_crt: Path, ca_key: Path, out_dir: Path, name: str, cn: str, org: str | None, days: int = 30
) -> tuple[Path, Path]:
    """Writes out_dir/<name>.crt and .key (EC P-256, clientAuth) and returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    key, csr, crt = out_dir / f"{name}.key", out_dir / f"{name}.csr", out_dir / f"{name}.crt"
    ext = out_dir / f"{name}.ext"
    subj = f"/CN={cn}" + (f"/O={org}" if org else "")
    ext.write_text("keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
    key.chmod(0o600)
    _openssl("req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr))
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca_crt),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-CAserial",
        str(out_dir / "ca.srl"),
        "-days",
        str(days),
        "-extfile",
        str(ext),
        "-out",
        str(crt),
    )
    csr.unlink()
    ext.unlink()
    return crt, key


def _openssl(*args: str) -> None:
    r = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {r.stderr.strip()}")
