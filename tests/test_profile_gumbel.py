"""scripts/profile_gumbel.py's hot loop on the CPU: its reading of nvdisasm's text, one offline compile."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specfix.tools import recorded

SCRIPT = recorded.ROOT / "scripts" / "profile_gumbel.py"
spec = importlib.util.spec_from_file_location("profile_gumbel", SCRIPT)
pg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pg)

# nvdisasm -c -g's layout: a loop from .L_x_0 to the backward branch at 0x60 holding a forward branch, a
# straight-line instruction before it and a one-instruction loop (the kernel's trailing self-branch) after it.
SASS = """
\t//## File "/a/kernel.py", line 1
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
\t//## File "/a/kernel.py", line 5
        /*0010*/                   IMAD R2, R2, R3, RZ ;
        /*0020*/              @!P0 BRA `(.L_x_1) ;
\t//## File "/a/noise.py", line 7
        /*0030*/                   LOP3.LUT R2, R2, 0xff, RZ, 0xc0, !PT ;
.L_x_1:
        /*0040*/                   FFMA R4, R2, R5, R6 ;
\t//## File "/x/triton/language/standard.py", line 9
        /*0050*/                   FMNMX R7, R4, R7, !PT ;
\t//## File "/a/kernel.py", line 5
        /*0060*/               @P1 BRA `(.L_x_0) ;
        /*0070*/                   EXIT ;
.L_x_2:
        /*0080*/                   BRA `(.L_x_2);
"""


def test_hot_loop_is_the_largest_backward_branch_and_each_instruction_has_the_line_above_it():
    assert pg.hot_loop_instructions(SASS) == [
        ("/a/kernel.py", 5, "IMAD"),
        ("/a/kernel.py", 5, "BRA"),
        ("/a/noise.py", 7, "LOP3.LUT"),
        ("/a/noise.py", 7, "FFMA"),
        ("/x/triton/language/standard.py", 9, "FMNMX"),
        ("/a/kernel.py", 5, "BRA"),
    ]


def test_parts_count_branches_to_the_loop_and_triton_library_lines_to_the_argmax():
    parts = {("/a/kernel.py", 5): "logits in", ("/a/noise.py", 7): "hash"}
    counts = pg.count_parts(pg.hot_loop_instructions(SASS), parts)
    assert counts == {"hash": 2, "logarithms": 0, "argmax": 1, "logits in": 1, "loop": 2}


def test_offline_sm90_fast_noise_bf16_hot_loop():
    if not all(Path(pg._bin(tool)).exists() for tool in ("ptxas", "nvdisasm", "cuobjdump")):
        pytest.skip("triton's bundled ptxas, nvdisasm or cuobjdump is missing")
    done = subprocess.run(
        [sys.executable, SCRIPT, "--hot-loop-only", "--arch", "90"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    line = next(x for x in done.stdout.splitlines() if "1,024 x 151,936 bf16" in x)
    parts = [float(x) for x in re.findall(r"(?:hash|logarithms|argmax|logits in|loop)\s+(\d+\.\d+)", line)]
    total = float(re.search(r"total\s+([\d.]+)", line)[1])
    assert len(parts) == 5
    assert 20 <= total <= 40
    assert sum(parts) == pytest.approx(total, abs=0.03)  # each printed to two decimals
