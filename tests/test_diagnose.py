"""specfix diagnose: every fixture log gets the verdict written for it in tests/fixtures/diagnose/
expected.json (by hand, from what each log holds), the JSON report follows SCHEMA, bad input gets one line
and status 2, the log is streamed, and the README's report is what the tool prints."""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from specfix.__main__ import main
from specfix.tools import diagnose as dg
from specfix.tools import recorded
from specfix.tools.diagnose_scan import MAX_LINE

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "diagnose"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
LOGS = {name: e for name, e in EXPECTED.items() if "verdict" in e}
BAD = {name: e for name, e in EXPECTED.items() if "verdict" not in e}


def _report(path: Path) -> dict:
    status, text = dg.run(str(path), as_json=True)
    assert status == 0, text
    return json.loads(text)


@pytest.mark.parametrize("name", sorted(LOGS))
def test_fixture_verdict(name):
    want, report = LOGS[name], _report(FIXTURES / name)
    got = report["verdict"]
    assert (got["id"], got["confidence"]) == (want["verdict"], want["confidence"]), got["reasons"]
    setup, err = report["setup"], report["python_error"]
    fixes = {f["pr"]: f["logged_version_has_it"] for f in report["fixes"]}
    checks = {
        "first_kernel": report["asserts"]["first_kernel"],
        "assert_lines": report["asserts"]["lines"],
        "distinct": len(report["asserts"]["distinct"]),
        "vllm_version": setup.get("vllm_version"),
        "has_47029": fixes[47029],
        "has_46533": fixes[46533],
        "has_47066": fixes[47066],
        "process": err and err["process"],
        "complete": err and err["complete"],
        "ends_at_func": err and err["frames"] and err["frames"][-1]["func"],
        "exception": err and err["exception"],
        "error_kind": next(iter(report["errors"]), None),
        "launch_blocking": setup["launch_blocking"],
        "speculative_decoding": setup["speculative_decoding"],
    }
    for key, value in want.items():
        if key not in ("verdict", "confidence"):
            assert (checks[key] if key in checks else setup.get(key)) == value, key
    for reason in got["reasons"]:  # every line a reason cites exists
        assert all(1 <= n <= report["lines"] for n in reason["lines"])


def test_fixtures_cover_every_verdict():
    counts = {v: sum(e["verdict"] == v for e in LOGS.values()) for v in dg.VERDICTS}
    assert all(counts.values()), counts
    assert len(LOGS) + len(BAD) >= 30


def test_specfix_fixtures_are_the_recorded_transcripts():
    runs = recorded.load("embedding_assert_transcripts")["runs"]
    for name, run in runs.items():
        assert (FIXTURES / f"specfix_{name}.log").read_text() == run["output"], name
    rows = recorded.load("embedding_assert_ops")["rows"]
    take = next(r for r in rows if (r["op"], r["bad"], r["num_indices"]) == ("torch.take", "size", 3))
    assert (FIXTURES / "specfix_op_take_size_3.log").read_text() == take["transcript"] + "\n"


@pytest.mark.parametrize("name", sorted(LOGS))
def test_json_follows_schema(name):
    jsonschema.validate(_report(FIXTURES / name), dg.SCHEMA)


def test_schema_refuses_a_broken_report():
    report = _report(FIXTURES / "pd_decode_mtp_tp4.log")
    for broken in (
        {**report, "verdict": {**report["verdict"], "id": "probably_fine"}},
        {k: v for k, v in report.items() if k != "fixes"},
        {**report, "asserts": {**report["asserts"], "lines": "many"}},
        {**report, "lines": -1},
        {**report, "advice": []},
        {**report, "python_error": {**report["python_error"], "frames": [{"file": "x.py"}]}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, dg.SCHEMA)


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda tmp: tmp / "missing.log", "no such file"),
        (lambda tmp: tmp, "is a directory"),
        (lambda tmp: FIXTURES / "empty.log", "is empty"),
        (lambda tmp: FIXTURES / "binary.log", "looks binary"),
    ],
)
def test_bad_input_one_line_and_status_2(tmp_path, capsys, make, says):
    assert main(["diagnose", str(make(tmp_path))]) == 2
    out = capsys.readouterr()
    assert out.out == "" and says in out.err and out.err.count("\n") == 1
    assert "Traceback" not in out.err


def test_standard_input(monkeypatch, capsys):
    data = (FIXTURES / "ngram_small_batch.log").read_bytes()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["diagnose", "-", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"] == "standard input" and report["verdict"]["id"] == "placeholder_embedding"


def test_text_report_summarises_thousands_of_asserts():
    status, text = dg.run(str(FIXTURES / "thousands_of_asserts_tp8.log"))
    assert status == 0
    assert "5,600 assert line(s), 1 distinct" in text
    assert text.count("Assertion") == 0 and len(text.splitlines()) < 60
    assert text.splitlines()[2].startswith("Verdict: a -1 placeholder")


def test_ten_thousand_line_log(tmp_path):
    """The size the tool must read within a second (the figure is measured outside the tests)."""
    head = (FIXTURES / "pd_decode_mtp_tp4.log").read_text().splitlines()
    noise = '(APIServer pid=1) INFO:     10.0.3.17:50110 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    gather = (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: "
        'block: [3,0,0], thread: [{},0,0] Assertion `ind >=0 && ind < ind_dim_size && "vectorized '
        'gather kernel index out of bounds"` failed.'
    )
    body = [noise] * 4000 + [gather.format(i % 128) for i in range(10000 - 4000 - len(head))]
    path = tmp_path / "big.log"
    path.write_text("\n".join(head[:10] + body + head[10:]) + "\n")
    report = _report(path)
    assert report["lines"] == 10000
    assert report["asserts"]["lines"] == len(body) - 4000 + 160
    assert report["verdict"]["id"] == "placeholder_embedding"


def test_the_command_imports_neither_torch_nor_triton():
    """Reading a log takes a tenth of a second; importing torch took seconds, so ``specfix diagnose`` must
    not (how long it takes is measured outside the tests)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECFIX_", "TRITON_"))}
    out = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "specfix",
            "diagnose",
            "--json",
            str(FIXTURES / "pd_decode_mtp_tp4.log"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["verdict"]["id"] == LOGS["pd_decode_mtp_tp4.log"]["verdict"]
    imported = {
        line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")
    }
    assert "specfix.tools.diagnose" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "triton")}


def test_long_line_is_read_in_pieces(tmp_path):
    path = tmp_path / "long.log"
    line = (FIXTURES / "specfix_op_take_size_3.log").read_text().splitlines()[1]
    path.write_text("x" * (2 * MAX_LINE + 5) + "\n" + line + "\n")
    report = _report(path)
    assert report["lines"] == 4 and report["asserts"]["first_kernel"] == "operator()"


def test_readme_report_is_what_the_tool_prints(monkeypatch):
    monkeypatch.chdir(ROOT)
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"```console\n\$ specfix diagnose (\S+)\n(.*?)```", readme, re.S)
    assert match, "README has no specfix diagnose report"
    status, text = dg.run(match.group(1))
    assert status == 0 and match.group(2).rstrip("\n") == text


# -- vLLM 0.33.0 logs, each trimmed to the lines that matter ------------------------------------------------
_API, _CORE = (
    "(APIServer pid=1) INFO 12-02 14:02:11 ",
    "(EngineCore_DP0 pid=245) ERROR 12-02 14:05:13 [core.py:1012] ",
)
_SITE = '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/'
_EMBEDDING_ASSERT = (
    "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1553: indexSelectLargeIndex: block: [212,0,0], "
    "thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed."
)
_V1_033 = "\n".join(
    [
        _API + "[api_server.py:1921] vLLM API server version 0.33.0",
        _API + "[utils.py:331] non-default args: {'model': 'meta-llama/Llama-3.1-8B-Instruct', "
        "'speculative_config': {'method': 'suffix', 'num_speculative_tokens': 4}}",
        # the fall-back warning of vllm/config/vllm.py (line 761 in 0.33.0)
        "(APIServer pid=1) WARNING 12-02 14:02:14 [vllm.py:761] Model Runner V2 does not yet support "
        "speculative method 'suffix'; using the V1 model runner instead.",
        '(APIServer pid=1) INFO:     10.1.0.4:40110 - "POST /v1/completions HTTP/1.1" 200 OK',
        _EMBEDDING_ASSERT,
        _CORE + "EngineCore encountered a fatal error.",
        _CORE + "Traceback (most recent call last):",
        _CORE + _SITE + 'engine/core.py", line 412, in step_with_batch_queue',
        _CORE + "    model_output = future.result()",
        _CORE + _SITE + 'worker/gpu_model_runner.py", line 301, in get_output',
        _CORE + "    self.async_copy_ready_event.synchronize()",
        _CORE + "torch.AcceleratorError: CUDA error: device-side assert triggered",
        _CORE + "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    ]
)
# Model Runner V2 says so from vllm/v1/worker/gpu_worker.py (line 513 in 0.33.0); its frames are under gpu/.
_V2_033 = "\n".join(
    [
        _API + "[api_server.py:1921] vLLM API server version 0.33.0",
        _API + "[utils.py:331] non-default args: {'model': 'Qwen/Qwen3-32B', 'speculative_config': "
        "{'method': 'eagle3', 'model': 'acme/qwen3-32b-eagle3', 'num_speculative_tokens': 3}}",
        "(EngineCore_DP0 pid=245) INFO 12-02 14:02:30 [gpu_worker.py:513] Using V2 Model Runner",
        _EMBEDDING_ASSERT,
        _CORE + "Traceback (most recent call last):",
        _CORE + _SITE + 'worker/gpu/spec_decode/rejection_sampler.py", line 260, in __call__',
        _CORE + "    num_sampled = num_sampled.cpu()",
        _CORE + "torch.AcceleratorError: CUDA error: device-side assert triggered",
    ]
)


def _diagnosed(text: str) -> dict:
    return dg.diagnose(text.splitlines(), "test")


def _reasons(report: dict) -> str:
    return " ".join(r["text"] for r in report["verdict"]["reasons"])


def test_embedding_assert_on_a_clamping_release_is_an_out_of_range_id_with_low_confidence():
    """0.33.0 clamps in the V1 runner (PR #47029): the assert says an id was -1 or past the vocabulary."""
    fixed = _diagnosed(_V1_033)
    assert (fixed["verdict"]["id"], fixed["verdict"]["confidence"]) == ("other_index", "low")
    assert "vocabulary size" in _reasons(fixed) and "multimodal" not in _reasons(fixed)
    assert not any("Report it" in line for line in fixed["advice"])
    unfixed = _diagnosed(_V1_033.replace("0.33.0", "0.24.0"))  # the last release without the clamp
    assert (unfixed["verdict"]["id"], unfixed["verdict"]["confidence"]) == ("placeholder_embedding", "high")


def test_the_runner_is_read_from_its_log_line_or_its_frames():
    assert _diagnosed(_V1_033)["setup"]["model_runner"] == "V1"
    v2 = _diagnosed(_V2_033)
    assert v2["setup"]["model_runner"] == "V2" and v2["setup"]["lines"]["model_runner"] == 3
    assert v2["verdict"]["id"] == "other_index" and "Model Runner V2 runs" in _reasons(v2)
    assert "V1" not in _reasons(v2) + " ".join(v2["advice"])
    # no runner line (an older release, or a log pasted from the crash on): a V2 frame says it
    from_frames = _diagnosed(_V2_033.replace("Using V2 Model Runner", "Model loading took 31.4 GiB"))
    assert from_frames["setup"]["model_runner"] == "V2"
    assert from_frames["setup"]["lines"]["model_runner"] == 6


@pytest.mark.parametrize(
    "prefix",
    ["2026-12-02T14:05:{:02d}.000007919Z ", "web-1  | ", "web-1  | 2026-12-02T14:05:{:02d}.5+00:00 "],
    ids=["docker logs -t", "docker compose", "compose with timestamps"],
)
def test_log_collector_prefixes_are_stripped(prefix):
    lines = [prefix.format(n % 60) + line for n, line in enumerate(_V1_033.splitlines())]
    plain, prefixed = _diagnosed(_V1_033), dg.diagnose(lines, "test")
    assert prefixed["python_error"]["exception"] == "torch.AcceleratorError"
    assert prefixed["python_error"]["ends_at"] == plain["python_error"]["ends_at"]
    assert prefixed["verdict"] == plain["verdict"] and prefixed["setup"] == plain["setup"]


def test_a_log_cut_inside_a_source_line_does_not_show_the_cut_text():
    cut = _V1_033[: _V1_033.index("model_output = future.result()") + len("mode")]
    report = _diagnosed(cut)
    err = report["python_error"]
    assert err["complete"] is False and err["ends_at"] == "core.py:412 in step_with_batch_queue"
    assert ": mode" not in dg.render(report)


def test_a_clean_log_says_no_crash():
    clean = _V1_033.splitlines()[:4] + ["(APIServer pid=1) INFO:     Shutting down"]
    report = dg.diagnose(clean, "test")
    assert (report["verdict"]["id"], report["verdict"]["confidence"]) == ("no_crash", "medium")
    text = dg.render(report)
    assert "Verdict: no crash in this log" in text and "Explained in" not in text and "greedy" not in text
    # a traceback cut before its error line is not a clean log
    cut = _V1_033.splitlines()[:4] + _V1_033.splitlines()[6:9]
    assert dg.diagnose(cut, "test")["verdict"]["id"] == "inconclusive"


def test_help_is_plain_text_and_a_subcommand_error_shows_that_subcommand_usage(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out
    for argv, usage in [
        (["diagnose", "x.log", "--jsn"], "usage: specfix diagnose"),
        (["bench", "--jsn", "x.json"], "usage: specfix bench"),
        (["bench", "--device", "cpu", "--only", "nope"], "usage: specfix bench"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(usage), err


def test_bench_json_in_a_missing_folder_is_refused_and_no_folder_made(tmp_path, capsys):
    where = tmp_path / "typo" / "x.json"
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--device", "cpu", "--only", "ceilings", "--json", str(where)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--json {where}: no folder" in err
    assert not where.parent.exists()
