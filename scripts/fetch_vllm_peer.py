"""Fetch vLLM's own samplers from its released wheels into ``.peer/`` (git-ignored), to compare and time
specfix beside them.

    python scripts/fetch_vllm_peer.py [VERSION ...]    # default: 0.24.0 0.25.0 0.33.0

For each version, one wheel download (about 340 MB; skipped when the version was fetched before), from
which are kept:

- ``.peer/vllm_gumbel_<v>.py``: Model Runner V2's Gumbel sampler, ``vllm/v1/worker/gpu/sample/gumbel.py``
  (0.25.0 on); ``specfix.lab.masked_gumbel.load_vllm_sampler`` imports it, and the tests, chapter 4, the
  bench (``--peer .peer``) and ``scripts/compare_vllm_noise.py`` run it beside specfix's kernel.
- ``.peer/vllm_rejection_<v>.py``: the rejection sampler's functions and kernels,
  ``vllm/v1/sample/rejection_sampler.py``, which the bench times beside specfix's.
- ``.peer/src/<v>/``: the Python source that specfix's docstrings and chapters cite (``vllm/v1/``,
  ``vllm/config/``, ``vllm/engine/``, ``vllm/sampling_params.py``, ``vllm/envs.py``), as it is, for reading
  side by side and for the tests that check those citations.

Each file is vLLM's, with its top-level ``from vllm... import`` lines pointed at ``vllm_peer_shim`` (copied
next to them from ``scripts/``), so that it runs without the rest of vLLM. Nothing here is committed or
copied into specfix. Needs pip and the network; on a machine without network, copy ``.peer/`` there.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM = "vllm_peer_shim"
#: What is kept of each wheel: the name in .peer/ (by kind) and the file in the wheel.
FILES = {"gumbel": "vllm/v1/worker/gpu/sample/gumbel.py", "rejection": "vllm/v1/sample/rejection_sampler.py"}
#: The source kept for reading: whole folders, and single files.
SOURCE = (("vllm/v1/", "vllm/config/", "vllm/engine/"), ("vllm/sampling_params.py", "vllm/envs.py"))
DEFAULT_VERSIONS = ("0.24.0", "0.25.0", "0.33.0")


def standalone(source: str, version: str, member: str) -> str:
    """``source`` with each top-level ``from vllm... import names`` replaced by an import of the same names
    from the shim (vLLM's line numbers still hold), and a last line naming its origin."""
    lines = source.splitlines()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
            span = node.end_lineno - node.lineno + 1
            lines[node.lineno - 1 : node.end_lineno] = [
                f"from {SHIM} import {names}  # was {node.module}"
            ] + ([""] * (span - 1))
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return "\n".join(lines) + (
        f"\n\n# vLLM {version}'s {member} (sha256 {digest}...), taken from its wheel "
        f"by scripts/fetch_vllm_peer.py; its vllm imports point at {SHIM}.\n"
    )


def download_wheel(version: str, into: Path, python: str = sys.executable) -> Path:
    """vLLM ``version``'s x86-64 Linux wheel for CPython 3.12 (pure Python is all that is read of it)."""
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_31_x86_64",
            "--platform",
            "manylinux_2_34_x86_64",
            "-d",
            str(into),
            f"vllm=={version}",
        ],
        check=True,
    )
    (wheel,) = into.glob(f"vllm-{version}-*.whl")
    return wheel


def extract(wheel: Path, version: str, peer: Path) -> list[Path]:
    """Write the kept files of ``wheel`` into ``peer`` (a sampler the release does not have is skipped)."""
    written = []
    src = peer / "src" / version
    shutil.rmtree(src, ignore_errors=True)
    folders, files = SOURCE
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        for kind, member in FILES.items():
            if member in names:
                path = peer / f"vllm_{kind}_{version.replace('.', '_')}.py"
                path.write_text(standalone(zf.read(member).decode(), version, member))
                written.append(path)
        kept = [n for n in names if n.endswith(".py") and (n.startswith(folders) or n in files)]
        zf.extractall(src, kept)
    return [*written, src]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=list(DEFAULT_VERSIONS))
    parser.add_argument("--peer", default=str(ROOT / ".peer"), help="where to put the files (git-ignored)")
    parser.add_argument("--wheel", help="a vLLM wheel already on disk (one version), instead of pip")
    args = parser.parse_args(argv)
    peer = Path(args.peer)
    peer.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name(f"{SHIM}.py"), peer / f"{SHIM}.py")
    for version in args.versions:
        done = peer / f".fetched-{version}"
        if done.is_file() and not args.wheel:
            print(f"vLLM {version}: already in {peer}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            wheel = Path(args.wheel) if args.wheel else download_wheel(version, Path(tmp))
            written = extract(wheel, version, peer)
        done.write_text(wheel.name + "\n")
        print(f"vLLM {version}: " + ", ".join(str(p) for p in written))


if __name__ == "__main__":
    main()
