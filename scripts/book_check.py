"""Check the built book in a real browser: headless Chromium (Debian's), driven by Playwright.

    python scripts/book_check.py [build/book/html] [--chromium /usr/bin/chromium]

Serves the book over http on 127.0.0.1 (the search page needs http), opens every page and fails on
- any console error or uncaught page error,
- any resource that fails to load or answers 400 or more, and any request that leaves this machine
  (the book must read offline: such requests are blocked and reported),
- any <img> whose natural width is 0 once it has loaded,
- a chapter whose page shows fewer or more figures than its cells displayed when the book ran it (MyST-NB's
  executed copy, beside the html folder; a figure a cell leaves undisplayed already fails the build, see
  specfix.figures.style.watch_figures),
- a page that shows a path of the machine that built it (a kernel's /tmp/ipykernel_ file, the venv, the
  checkout), or that scrolls sideways on a 390 px wide phone screen,
- a figure scaled so far into the text column that its smallest text (style.SMALLEST_PT) ends up under
  style.MIN_TEXT_PX tall,
- any link within the book that points to a file that is not there, or to an anchor the page lacks,
- any widget view left on a page (the book shows each widget's static figure instead),
- an exercise's "Exercise" chip whose text contrasts with its fill less than 4.5:1, in light or dark mode,
- output text or a table cut off at the column's right edge (wider than its box: the reader would have to
  scroll it sideways to see where the fix is),
- a search for `idx_mapping` that finds nothing, or whose excerpts show the theme's buttons ("Light Dark").
It saves a screenshot of each chapter's first screen next to the book (build/book/screenshots/) and ends
with one line `book-check: N passed, M failed`, one check per page and kind plus the search.

Playwright drives the browser given by --chromium; it never downloads one (`playwright install` is not
needed and cannot run on machines without a network).
"""

import argparse
import functools
import http.server
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
SEARCH_TERM = "idx_mapping"
FIGURE_MIMES = ("image/svg+xml", "image/png")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
VIEWPORT = {"width": 1280, "height": 900}
TIMEOUT_MS = 60_000

_IMAGES_JS = """async () => {
  const images = [...document.images];
  for (const img of images) {
    img.loading = "eager";
    try { await img.decode(); } catch (e) { /* judged below by its natural width */ }
  }
  return images.filter((img) => !(img.complete && img.naturalWidth > 0))
               .map((img) => img.getAttribute("src"));
}"""
PHONE = {"width": 390, "height": 844}
_SIDEWAYS_JS = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
# Every toggle opened first, so that a figure behind one is measured as a reader who opens it sees it.
_FIGURES_JS = """() => {
  document.querySelectorAll('details').forEach((d) => { d.open = true; });
  return [...document.querySelectorAll('.cell_output img')].map((img) => ({
    src: img.getAttribute('src'), natural: img.naturalWidth, shown: img.getBoundingClientRect().width}));
}"""
_LINKS_JS = "() => [...document.querySelectorAll('a[href]')].map((a) => a.href)"
# The exercise chip (book.css: div.cell.tag_exercise::before) in both colour modes: its text and fill colours.
_CHIP_JS = """(mode) => {
  document.documentElement.dataset.theme = mode;
  return [...document.querySelectorAll('div.cell.tag_exercise')].slice(0, 1).map((cell) => {
    const chip = getComputedStyle(cell, '::before');
    return {mode, color: chip.color, background: chip.backgroundColor};
  });
}"""
# Outputs wider than their box: text (<pre>) and tables that the page cuts off or scrolls inside the column.
_CUT_JS = """() => [...document.querySelectorAll('.cell_output pre, .cell_output table')]
  .filter((el) => el.scrollWidth > el.clientWidth + 2
          || (el.tagName === 'TABLE' && el.getBoundingClientRect().width > el.parentElement.clientWidth + 2))
  .map((el) => (el.tagName === 'TABLE' ? 'table: ' : 'text: ') + el.innerText.trim().slice(0, 70))"""
_WIDGETS_JS = f"() => document.querySelectorAll('script[type=\"{WIDGET_VIEW}\"], .jupyter-widgets').length"
_MATHJAX_JS = "() => window.MathJax && window.MathJax.startup ? window.MathJax.startup.promise : null"


class _Anchors(HTMLParser):
    """Every id (and every <a name>) in one HTML file: the targets a `#fragment` may point at."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.names = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if value and (key == "id" or (tag == "a" and key == "name")):
                self.names.add(value)


@functools.cache
def _style():
    """specfix.figures.style, loaded from its file (importing the package would import torch)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_specfix_style", ROOT / "specfix" / "figures" / "style.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def displayed_figures(executed: Path) -> int:
    """How many figures the cells of an executed notebook displayed (outputs holding an image)."""
    import json

    cells = json.loads(executed.read_text())["cells"]
    return sum(
        any(mime in output.get("data", {}) for mime in FIGURE_MIMES)
        for cell in cells
        for output in cell.get("outputs", [])
    )


def local_paths(text: str) -> list:
    """The paths of the machine that built the book found in a page's text: a kernel's temporary file, this
    checkout, the Python environment that ran the chapters (a recording's paths, labelled, may stay)."""
    import re

    found = re.findall(r"/tmp/ipykernel_[\w/.]*", text)
    found += [place for place in {str(ROOT), sys.prefix, str(Path(sys.prefix).resolve())} if place in text]
    return sorted(set(found))


def _rgb(css: str) -> tuple:
    import re

    values = [float(v) for v in re.findall(r"[\d.]+", css)]
    return tuple(values[:3]) if len(values) >= 3 else (0.0, 0.0, 0.0)


def contrast(color: str, background: str) -> float:
    """WCAG contrast ratio of two CSS rgb() colours (1 to 21)."""

    def luminance(css):
        channels = [c / 255 for c in _rgb(css)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    light, dark = sorted((luminance(color), luminance(background)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def chrome_in_excerpts(excerpts: list) -> list:
    """Search excerpts that show the theme's buttons instead of the page's text."""
    return [
        text[:80]
        for text in excerpts
        if any(word in text for word in ("System Settings", "Light Dark", "Color mode"))
    ]


def small_figures(figures: list) -> list:
    """The figures (from _FIGURES_JS) whose smallest text ends up under style.MIN_TEXT_PX tall."""
    style = _style()
    return [
        f"{f['src']}: {f['natural']} px wide shown at {f['shown']:.0f} px, so its {style.SMALLEST_PT} pt "
        f"text is {style.text_px(f['natural'], f['shown']):.1f} px tall (at least {style.MIN_TEXT_PX} px)"
        for f in figures
        if f["natural"] and style.text_px(f["natural"], f["shown"]) < style.MIN_TEXT_PX
    ]


@functools.cache
def anchors_of(path: Path) -> frozenset:
    parser = _Anchors()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.names)


def broken_link(url: str, root: Path, origin: str):
    """Why `url` (absolute, as the browser resolved an href) is broken, or None when it resolves.

    Only links into the book (same scheme and host as `origin`) are judged; any other link is None.
    """
    parts = urlsplit(url)
    if f"{parts.scheme}://{parts.netloc}" != origin:
        return None
    relative = unquote(parts.path).lstrip("/")
    target = (root / relative).resolve()
    if not target.is_relative_to(root.resolve()):
        return f"{url}: points outside the book"
    if target.is_dir():
        target = target / "index.html"
    if not target.is_file():
        return f"{url}: no file {target.relative_to(root.resolve())}"
    fragment = unquote(parts.fragment)
    if fragment and target.suffix == ".html" and fragment not in anchors_of(target):
        return f"{url}: {target.relative_to(root.resolve())} has no anchor #{fragment}"
    return None


def book_pages(root: Path) -> list:
    """Every HTML page of the book, relative to `root`; theme and static assets (folders named _*) aside."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.html")
        if not any(part.startswith("_") for part in p.relative_to(root).parts[:-1])
    )


def chapter_pages(pages: list) -> list:
    return [page for page in pages if page.startswith("notebooks/")]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def _serve(root: Path):
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _check_page(page, url, root, origin, outside):
    """Open one page; return {check name: [problems]} for it."""
    console, resources = [], []
    page.on("console", lambda msg: console.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda err: console.append(f"uncaught: {err}"))
    page.on("requestfailed", lambda req: resources.append(f"{req.url}: {req.failure}"))
    page.on(
        "response",
        lambda resp: resources.append(f"{resp.url}: HTTP {resp.status}") if resp.status >= 400 else None,
    )
    outside.clear()
    page.goto(url, wait_until="networkidle")
    page.evaluate(_MATHJAX_JS)  # wait until MathJax has typeset the page (and loaded its fonts)
    page.wait_for_load_state("networkidle")
    images = [f"img {src!r} has natural width 0" for src in page.evaluate(_IMAGES_JS)]
    links = sorted(
        {problem for href in page.evaluate(_LINKS_JS) if (problem := broken_link(href, root, origin))}
    )
    widgets = page.evaluate(_WIDGETS_JS)
    paths = [f"shows {path}" for path in local_paths(page.evaluate("() => document.body.innerText"))]
    figures = page.evaluate(_FIGURES_JS)
    counted, small, chips = [], [], []
    cut = page.evaluate(_CUT_JS)
    if url.rsplit("/", 2)[-2] == "notebooks":
        for mode in ("light", "dark"):
            chips += [
                f"exercise chip in {mode} mode: {c['color']} on {c['background']}, contrast "
                f"{contrast(c['color'], c['background']):.1f} (at least 4.5)"
                for c in page.evaluate(_CHIP_JS, mode)
                if contrast(c["color"], c["background"]) < 4.5
            ]
        page.evaluate("() => { document.documentElement.dataset.theme = 'light'; }")
        stem = url.rsplit("/", 1)[-1].removesuffix(".html")
        executed = root.parent / "jupyter_execute" / "notebooks" / f"{stem}.ipynb"
        if not executed.is_file():
            counted.append(f"no executed copy of the chapter at {executed}")
        elif (shown := displayed_figures(executed)) != len(figures):
            counted.append(f"its cells displayed {shown} figure(s), the page shows {len(figures)}")
        small = small_figures(figures)
    return {
        "console": console,
        "resources": resources + [f"{u}: request leaves this machine (blocked)" for u in outside],
        "images": images,
        "links": links,
        "widgets": [f"{widgets} widget view(s) left on the page"] if widgets else [],
        "figures": counted,
        "legible": small,
        "paths": paths,
        "chip": chips,
        "cut": [f"cut off at the right edge: {what}" for what in cut],
    }


def _search(page, origin, term):
    """The pages a search for `term` lists, from the book's search page."""
    page.goto(f"{origin}/search.html?q={term}", wait_until="networkidle")
    page.wait_for_function(
        "() => { const s = document.querySelector('#search-results'); "
        "return s && (s.querySelector('li') || /found|did not match/i.test(s.textContent)); }",
        timeout=TIMEOUT_MS,
    )
    page.wait_for_load_state("networkidle")
    links = page.eval_on_selector_all("#search-results li a", "(links) => links.map((a) => a.href)")
    excerpts = page.eval_on_selector_all("#search-results li p.context", "(ps) => ps.map((p) => p.innerText)")
    return links, excerpts


def _arguments(argv):
    """The command line, checked: (args, root, screenshots folder, pages, chapter pages)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "html",
        nargs="?",
        default="build/book/html",
        type=Path,
        help="the built book (default: build/book/html)",
    )
    parser.add_argument(
        "--chromium",
        default="/usr/bin/chromium",
        help="the Chromium binary Playwright drives (default: Debian's, /usr/bin/chromium)",
    )
    parser.add_argument(
        "--screenshots",
        type=Path,
        default=None,
        help="where the chapters' first screens go (default: screenshots/ beside html)",
    )
    args = parser.parse_args(argv)
    root = args.html.resolve()
    if not (root / "search.html").is_file():
        parser.error(f"{args.html} holds no built book (no search.html): run `make book` first")
    if not Path(args.chromium).is_file():
        parser.error(f"--chromium {args.chromium} does not exist: install Debian's `chromium` package")
    shots = (args.screenshots or root.parent / "screenshots").resolve()
    shots.mkdir(parents=True, exist_ok=True)
    pages = book_pages(root)
    chapters = chapter_pages(pages)
    if not chapters:
        parser.error(f"{args.html} holds no chapter page (notebooks/*.html)")
    return args, root, shots, pages, chapters


def _browse(chromium, root, shots, pages, chapters):
    """Serve the book, check each page (desktop and phone), search it: (origin, results, hits, excerpts)."""
    from playwright.sync_api import sync_playwright

    server = _serve(root)
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    results, outside = {}, []

    def route(request_route):
        if request_route.request.url.startswith(origin + "/") or urlsplit(
            request_route.request.url
        ).scheme not in ("http", "https", "ws", "wss"):
            request_route.continue_()
        else:
            outside.append(request_route.request.url)
            request_route.abort()

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True)
            context = browser.new_context(viewport=VIEWPORT)
            context.set_default_timeout(TIMEOUT_MS)
            context.route("**/*", route)
            phone = browser.new_context(viewport=PHONE)
            phone.set_default_timeout(TIMEOUT_MS)
            phone.route("**/*", route)
            for name in pages:
                page = context.new_page()
                results[name] = _check_page(page, f"{origin}/{name}", root, origin, outside)
                if name in chapters:
                    page.evaluate("() => window.scrollTo(0, 0)")
                    page.screenshot(path=str(shots / (Path(name).stem + ".png")))
                page.close()
                page = phone.new_page()
                page.goto(f"{origin}/{name}", wait_until="networkidle")
                sideways = page.evaluate(_SIDEWAYS_JS)
                results[name]["phone"] = (
                    [f"scrolls {sideways} px sideways at {PHONE['width']} px"] if sideways > 0 else []
                )
                page.close()
            page = context.new_page()
            hits, excerpts = _search(page, origin, SEARCH_TERM)
            page.close()
            browser.close()
    finally:
        server.shutdown()
    return origin, results, hits, excerpts


def main(argv=None) -> int:
    args, root, shots, pages, chapters = _arguments(argv)
    origin, results, hits, excerpts = _browse(args.chromium, root, shots, pages, chapters)
    passed = failed = 0
    for name, checks in results.items():
        for check, problems in checks.items():
            if problems:
                failed += 1
                print(f"FAIL {name} [{check}]")
                for problem in problems:
                    print(f"    {problem}")
            else:
                passed += 1
    if chrome := chrome_in_excerpts(excerpts):
        failed += 1
        print(f"FAIL search excerpts show the theme's buttons: {chrome}")
    else:
        passed += 1
    if hits:
        passed += 1
        print(f"search for {SEARCH_TERM!r}: {len(hits)} page(s), e.g. {hits[0].removeprefix(origin + '/')}")
    else:
        failed += 1
        print(f"FAIL search for {SEARCH_TERM!r} found nothing")
    print(f"{len(pages)} pages opened in {args.chromium}; screenshots of {len(chapters)} chapters in {shots}")
    print(f"book-check: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
