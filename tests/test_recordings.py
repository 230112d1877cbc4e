"""Every GPU recording names the code it measured; one whose code has changed since must say so."""

import json

import pytest
import torch

from specfix.tools import recorded

GOLDEN_DIR = recorded.ROOT / "tests" / "golden"
FILES = (
    sorted(recorded.RECORDED_DIR.glob("*.json"))
    + sorted(GOLDEN_DIR.glob("*.json"))
    + sorted(GOLDEN_DIR.glob("*.pt"))
)


def changed_sources(name: str, meta: dict) -> list[str]:
    """The source files of recording ``name`` whose hash differs from the one ``meta`` recorded (all of them
    when it recorded none)."""
    hashes = meta.get("source_hash") or {}
    return [path for path, digest in recorded.source_hashes(name).items() if hashes.get(path) != digest]


def _meta(path):
    if path.suffix == ".pt":
        return torch.load(path, weights_only=True)["meta"]
    return json.loads(path.read_text())["meta"]


def test_every_recording_declares_its_sources_and_every_declared_one_exists():
    assert {p.stem for p in FILES} <= set(recorded.SOURCES)
    for name in recorded.SOURCES:
        assert recorded.SOURCES[name], name
        assert all(path.startswith(("scripts/", "specfix/")) for path in recorded.SOURCES[name]), name
        recorder = ("scripts/", "specfix/tools/bench/")
        assert any(path.startswith(recorder) for path in recorded.SOURCES[name]), f"{name}: name its script"
        recorded.source_hashes(name)  # every file is there


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_recording_vouches_only_for_the_code_it_measured(path):
    """A recording either carries the hashes of today's sources, or says that it describes older code; the
    label every chapter prints beside it then says so too."""
    meta = _meta(path)
    if meta.get("stale"):
        assert isinstance(meta["stale"], str) and len(meta["stale"]) > 20
        assert meta["stale"] in recorded.label(meta)
        return
    changed = changed_sources(path.stem, meta)
    assert not changed, (
        f"{path.name} was recorded from other versions of {changed}: re-record it on a GPU "
        f"(scripts named in recorded.SOURCES[{path.stem!r}]) or mark it stale"
    )
    assert meta.get("commit"), f"{path.name} does not name the commit it was made at"


def test_save_names_the_commit_and_the_sources_and_a_change_is_caught(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFIX_COMMIT", "abc123")
    path = recorded.save("gumbel_sanitizer", {"variants": {}}, tmp_path)
    meta = json.loads(path.read_text())["meta"]
    assert meta["commit"]  # the checkout's commit, or SPECFIX_COMMIT where there is no git
    assert set(meta["source_hash"]) == set(recorded.SOURCES["gumbel_sanitizer"])
    assert changed_sources("gumbel_sanitizer", meta) == []
    meta["source_hash"]["specfix/mrv2/gumbel.py"] = "0" * 16
    assert changed_sources("gumbel_sanitizer", meta) == ["specfix/mrv2/gumbel.py"]
    assert changed_sources("gumbel_sanitizer", {}) == list(recorded.SOURCES["gumbel_sanitizer"])
    with pytest.raises(ValueError, match="SOURCES"):
        recorded.gpu_meta("no_such_recording")


def test_recorders_say_what_is_missing_instead_of_failing_later(tmp_path):
    """record_all_gpu.sh names the Python it needs; the sanitizer's recorder names the missing tool."""
    import os
    import subprocess
    import sys

    script = recorded.ROOT / "scripts" / "record_all_gpu.sh"
    done = subprocess.run(
        ["bash", str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHON=str(tmp_path / "no-such-python")),
    )
    assert done.returncode == 2 and "cannot import torch and triton; set PYTHON" in done.stderr
    bare = {k: v for k, v in os.environ.items() if k != "PATH"}
    done = subprocess.run(
        [sys.executable, str(recorded.ROOT / "scripts" / "sanitize_gumbel.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(bare, PATH=str(tmp_path)),
    )
    assert done.returncode == 1 and "compute-sanitizer is not on PATH" in done.stderr
    assert not list(tmp_path.glob("*.json"))


def test_the_gpu_check_recording_the_readme_points_to_is_there_and_claims_no_more_than_it_holds():
    """README.md's GPU section points at the recorded `make gpu-check` runs: they are there, on the device the
    other recordings were made on, every part of every run has an outcome, and the count of green runs is the
    runs' own (no README or recording claims a green run the recording does not hold)."""
    readme = (recorded.ROOT / "README.md").read_text()
    assert "specfix/recorded/gpu_check_h200.json" in readme
    path = recorded.RECORDED_DIR / "gpu_check_h200.json"
    assert path.exists(), "record `make gpu-check` runs on the H200 (scripts/gpu_check.py --aggregate)"
    rec = json.loads(path.read_text())
    assert rec["meta"]["device"] == recorded.load("embedding_assert_ops")["meta"]["device"]
    green = [all(r["ok"] for r in run["results"]) and not run["missing"] for run in rec["runs"]]
    assert [run["green"] for run in rec["runs"]] == green
    tail = 0 if not green else next((i for i, g in enumerate(reversed(green)) if not g), len(green))
    assert rec["consecutive_green_runs"] == tail
    if tail < 3:
        assert "three consecutive" not in readme.lower()


def test_the_code_digest_ignores_layout_comments_and_docstrings_but_not_code():
    base = b'"""Doc."""\ndef f(x):\n    """Say why."""\n    return x + 1  # one more\n'
    same = b"def f(x):\n    return (\n        x\n        + 1\n    )\n"
    assert recorded.code_digest(base) == recorded.code_digest(same)
    assert recorded.code_digest(base) != recorded.code_digest(b"def f(x):\n    return x + 2\n")
    assert recorded.code_digest(base) != recorded.code_digest(b"def f(y):\n    return y + 1\n")
    # a string that is not a docstring is code
    assert recorded.code_digest(b"x = 'a'\n") != recorded.code_digest(b"x = 'b'\n")
    assert recorded.code_digest(b"x = 'a'\n") == recorded.code_digest(b'x = "a"\n')
