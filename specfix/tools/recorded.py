"""Results recorded on a GPU and shipped with the repo, so CPU-only readers see real GPU evidence.

Every recording is a JSON file under ``specfix/recorded/`` with a ``meta`` block (device, driver,
versions, date) written by :func:`save`; scripts under ``scripts/`` produce them on a GPU machine, and
notebooks show them with :func:`label` so that a reader always knows where a number came from.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

from specfix import runtime

RECORDED_DIR = Path(__file__).resolve().parents[1] / "recorded"


def gpu_meta() -> dict[str, str]:
    """Device, driver, versions and today's date, for labelling a recording."""
    meta = dict(runtime.describe())
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip().splitlines()
        meta["driver"] = driver[0] if driver else "unknown"
    except (OSError, subprocess.SubprocessError):
        meta["driver"] = "unknown"
    meta["date"] = datetime.date.today().isoformat()
    return meta


def save(name: str, data: dict, directory: Path | str = RECORDED_DIR) -> Path:
    """Write ``data`` plus a ``meta`` label to ``directory/name.json``."""
    path = Path(directory) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": gpu_meta(), **data}, indent=1, sort_keys=False) + "\n")
    return path


def load(name: str) -> dict:
    """Read a shipped recording; raises FileNotFoundError naming the script that makes it."""
    path = RECORDED_DIR / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no recording {path.name} in {RECORDED_DIR}; run the scripts/ recorder on a GPU"
        )
    return json.loads(path.read_text())


def label(meta: dict) -> str:
    """One line that says where and when a recording was made."""
    return (
        f"recorded on {meta.get('device', '?')} (driver {meta.get('driver', '?')}, "
        f"torch {meta.get('torch', '?')}, "
        f"triton {meta.get('triton', '?')}) on {meta.get('date', '?')}"
    )
