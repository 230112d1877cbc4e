"""Check the chapters in JupyterLab itself, driven in headless Chromium (Debian's) by Playwright.

    python scripts/lab_check.py [--chromium /usr/bin/chromium] [--screenshots build/lab/screenshots] [NN ...]

Starts JupyterLab with `make lab` (LAB_ARGS adds a port, a token, no browser), opens each chapter, runs all
its cells from the Run menu's command, and fails a chapter when
- a cell shows an error (its traceback is printed; a figure left undisplayed is one, see
  specfix.figures.style.watch_figures), or the cells did not all run within --timeout seconds,
- a figure does not render: an image output whose <img> is missing or has natural width 0,
- in chapters 03 and 04, moving a widget's slider (one arrow-key step) does not redraw its figure,
- a chapter file changed on disk (autosave is off: the chapters stay committed without outputs).
It saves a screenshot of each chapter at 1280 px, scrolled to its first figure, and ends with one line
`lab-check: N passed, M failed`. JupyterLab's own settings and workspaces go to a temporary folder.
"""

import argparse
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
VIEWPORT = {"width": 1280, "height": 900}
WIDGET_CHAPTERS = ("03", "04")
SLIDER = ".widget-slider .noUi-handle, .widget-slider input[type=range]"  # ipywidgets 8's slider handle
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of a traceback
# JupyterLab settings for the run: every cell in the page (no windowing), nothing saved, no news fetched.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}

_PANEL = "window.jupyterapp.shell.currentWidget"
_READY_JS = f"""async () => {{
  const panel = {_PANEL};
  if (!panel || !panel.sessionContext) return false;
  await panel.context.ready;
  await panel.sessionContext.ready;
  return !!(panel.sessionContext.session && panel.sessionContext.session.kernel);
}}"""
_RUN_ALL_JS = "async () => { await window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
# Done when the kernel is idle and every code cell ran, or a cell failed (run-all stops there).
_DONE_JS = f"""() => {{
  const panel = {_PANEL};
  const kernel = panel.sessionContext.session.kernel;
  const cells = panel.content.widgets.filter((c) => c.model.type === 'code');
  const failed = cells.some((c) => c.model.outputs.toJSON().some((o) => o.output_type === 'error'));
  const ran = cells.every((c) => c.model.executionCount !== null);
  return kernel.status === 'idle' && (ran || failed);
}}"""
_CELLS_JS = f"""() => {{
  const SLIDER = '{SLIDER}';
  const panel = {_PANEL};
  return panel.content.widgets.map((c, index) => {{
    if (c.model.type !== 'code') return null;
    const outputs = c.model.outputs.toJSON();
    const area = c.node.querySelector('.jp-OutputArea');
    const imgs = [...(area ? area.querySelectorAll('img') : [])]
      .filter((img) => !img.closest('.jupyter-widgets'));
    return {{
      index,
      ran: c.model.executionCount !== null,
      errors: outputs.filter((o) => o.output_type === 'error')
                     .map((o) => o.ename + ': ' + o.evalue + '\\n' + (o.traceback || []).join('\\n')),
      images: outputs.filter((o) => o.data && o.data['image/png']).length,
      rendered: imgs.filter((img) => img.complete && img.naturalWidth > 0).length,
      sliders: c.node.querySelectorAll(SLIDER).length,
    }};
  }}).filter((c) => c);
}}"""
_WIDGET_IMAGES_JS = f"""(index) => {{
  const cell = {_PANEL}.content.widgets[index];
  return [...cell.node.querySelectorAll('.jupyter-widgets img')].map((img) => img.src.slice(-200));
}}"""
_FIRST_FIGURE_JS = f"""() => {{
  const img = {_PANEL}.content.node.querySelector('.jp-OutputArea img');
  if (img) img.scrollIntoView({{block: 'center'}});
}}"""
_SHUTDOWN_JS = f"async () => {{ await {_PANEL}.sessionContext.shutdown(); }}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _digest(paths) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def start_lab(port: int, token: str, workdir: Path, log):
    """`make lab` with a fixed port and token, its kernels at CI scale on the CPU, watching their figures."""
    settings = workdir / "settings"
    for name, values in SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(
        os.environ,
        SPECFIX_SCALE=os.environ.get("SPECFIX_SCALE", "ci"),
        SPECFIX_DEVICE=os.environ.get("SPECFIX_DEVICE", "cpu"),
        SPECFIX_CHECK_FIGURES="1",
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(workdir / "workspaces"),
    )
    lab_args = (
        f"--no-browser --ServerApp.port={port} --ServerApp.port_retries=0 "
        f"--IdentityProvider.token={token} --LabApp.expose_app_in_browser=True"
    )
    process = subprocess.Popen(
        ["make", "--no-print-directory", "lab", f"LAB_ARGS={lab_args}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"`make lab` ended with status {process.returncode} (its log: {log.name})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=5):
                return process
        except OSError:
            time.sleep(1)
    stop_lab(process)
    raise RuntimeError(f"JupyterLab did not answer on port {port} within 180 s (its log: {log.name})")


def stop_lab(process) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def _slider_redraws(page, index: int, timeout_s: float) -> bool:
    """Move the cell's first slider one step (arrow key); True once its widget's figure has changed."""
    before = page.evaluate(_WIDGET_IMAGES_JS, index)
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    handle = cell.locator(SLIDER).first
    handle.scroll_into_view_if_needed()
    handle.focus()
    page.keyboard.press("ArrowRight")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        after = page.evaluate(_WIDGET_IMAGES_JS, index)
        if after and after != before:
            return True
        page.wait_for_timeout(500)
    return False


def check_chapter(context, base: str, token: str, name: str, shots: Path, timeout_s: float) -> dict:
    """Open, run and judge one chapter; return {check name: [problems]}."""
    page = context.new_page()
    problems = {"run": [], "errors": [], "figures": [], "widgets": []}
    try:
        # A workspace of its own, reset: JupyterLab would otherwise reopen the chapters checked before.
        page.goto(
            f"{base}/lab/workspaces/check-{name[:2]}/tree/{name}?reset&token={token}",
            wait_until="domcontentloaded",
        )
        page.wait_for_function(
            f"(name) => window.jupyterapp && {_PANEL} && {_PANEL}.sessionContext "
            f"&& {_PANEL}.context.path === name",
            arg=name,
            timeout=120_000,
        )
        if not page.evaluate(_READY_JS):
            problems["run"].append("no kernel started")
            return problems
        started = time.monotonic()
        page.evaluate(_RUN_ALL_JS)
        try:
            page.wait_for_function(_DONE_JS, polling=1000, timeout=timeout_s * 1000)
        except Exception:  # noqa: BLE001  (Playwright's TimeoutError: reported, the checks below still run)
            problems["run"].append(f"the cells had not all run after {timeout_s:.0f} s")
        took = time.monotonic() - started
        page.wait_for_timeout(1000)  # the last outputs reach the page
        cells = page.evaluate(_CELLS_JS)
        print(
            f"  {name}: {sum(c['ran'] for c in cells)} of {len(cells)} code cells ran in {took:.0f} s, "
            f"{sum(c['rendered'] for c in cells)} figures rendered"
        )
        for cell in cells:
            problems["errors"] += [f"cell {cell['index']}: {error}" for error in cell["errors"]]
            if cell["rendered"] < cell["images"]:
                problems["figures"].append(
                    f"cell {cell['index']}: {cell['images']} figure(s), {cell['rendered']} rendered"
                )
        if not problems["errors"] and not any(cell["ran"] for cell in cells):
            problems["run"].append("no cell ran")
        sliders = [cell for cell in cells if cell["sliders"]]
        if name[:2] in WIDGET_CHAPTERS and not sliders:
            problems["widgets"].append("no slider widget found")
        for cell in sliders:
            if _slider_redraws(page, cell["index"], timeout_s=60):
                print(f"  {name}: cell {cell['index']}: slider moved, figure redrawn")
            else:
                problems["widgets"].append(f"cell {cell['index']}: slider moved, figure not redrawn")
        page.evaluate(_FIRST_FIGURE_JS)
        page.wait_for_timeout(300)
        page.screenshot(path=str(shots / f"{Path(name).stem}.png"))
        page.evaluate(_SHUTDOWN_JS)
    finally:
        page.close()
    return problems


def _run_chapters(chromium: str, paths: list, shots: Path, timeout_s: float) -> dict:
    """Start JupyterLab, check each chapter in it, stop it: {chapter: {check: [problems]}}."""
    from playwright.sync_api import sync_playwright

    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    results = {}
    with tempfile.TemporaryDirectory(prefix="specfix-lab-check-") as tmp:
        log = open(Path(tmp) / "lab.log", "w")  # noqa: SIM115  (closed with the folder)
        lab = start_lab(port, token, Path(tmp), log)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, headless=True)
                context = browser.new_context(viewport=VIEWPORT)
                context.set_default_timeout(120_000)
                # JupyterLab reads offline: any request that leaves this machine is blocked.
                context.route(
                    "**/*",
                    lambda route: (
                        route.continue_()
                        if urlsplit(route.request.url).hostname in ("127.0.0.1", None)
                        or not route.request.url.startswith("http")
                        else route.abort()
                    ),
                )
                for path in paths:
                    results[path.name] = check_chapter(context, base, token, path.name, shots, timeout_s)
                browser.close()
        finally:
            stop_lab(lab)
            log.close()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="chapter numbers to check (default: all), e.g. 03 04")
    parser.add_argument(
        "--chromium",
        default="/usr/bin/chromium",
        help="the Chromium binary Playwright drives (default: Debian's, /usr/bin/chromium)",
    )
    parser.add_argument(
        "--screenshots",
        type=Path,
        default=ROOT / "build" / "lab" / "screenshots",
        help="where each chapter's screenshot goes (default: build/lab/screenshots)",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds for one chapter's cells to run")
    args = parser.parse_args(argv)
    if not Path(args.chromium).is_file():
        parser.error(f"--chromium {args.chromium} does not exist: install Debian's `chromium` package")
    paths = sorted(p for p in NOTEBOOKS.glob("*.ipynb") if not args.chapters or p.name[:2] in args.chapters)
    if not paths:
        parser.error(f"no chapter matches {args.chapters}")
    shots = args.screenshots.resolve()
    shots.mkdir(parents=True, exist_ok=True)
    before = _digest(paths)
    results = _run_chapters(args.chromium, paths, shots, args.timeout)
    changed = sorted(name for name, digest in _digest(paths).items() if before[name] != digest)

    passed = failed = 0
    for name, checks in results.items():
        if name in changed:
            checks["unchanged"] = [f"{name} changed on disk during the check"]
        for check, problems in checks.items():
            if problems:
                failed += 1
                print(f"FAIL {name} [{check}]")
                for problem in problems:
                    print("    " + ANSI.sub("", problem).replace("\n", "\n    "))
            else:
                passed += 1
    print(f"{len(results)} chapters run in JupyterLab ({args.chromium}); screenshots in {shots}")
    print(f"lab-check: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
