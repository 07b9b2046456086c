"""A page in Debian's Chromium (/usr/bin/chromium, installed by scripts/setup.sh), headless, driven
over the DevTools protocol by Playwright (its pip wheel bundles the driver; no browser is downloaded).

:func:`open_page` collects every JavaScript error, console error or warning and every request that
leaves the page's own files; before the page is read it proves on a throw-away page that those
listeners do catch an error, so an empty list means something. Screenshots and pages kept for a
person go to ``test-artifacts/`` at the repository root (CI: in the clone it tested, beside
``.ci/run``).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
#: the flags GUIDE.md names for a quiet headless Chromium
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync"]

#: every chart of a report page: its size, legend, row labels and the series of its drawn marks
READ_CHARTS = """() => Array.from(document.querySelectorAll('svg.chart')).map(svg => ({
  id: svg.id,
  width: svg.getBoundingClientRect().width, height: svg.getBoundingClientRect().height,
  legend: Array.from(svg.querySelectorAll('.legend-item')).map(e => e.getAttribute('data-series')),
  rows: Array.from(svg.querySelectorAll('.row-label')).map(e => e.textContent),
  marks: Array.from(svg.querySelectorAll('rect.bar, path.series')).filter(e => {
    const b = e.getBBox(); return b.width > 0 && b.height >= 0 && (b.width * Math.max(b.height, 1)) > 0; }).length,
  series: Array.from(new Set(Array.from(svg.querySelectorAll('rect.bar, path.series')).map(e => e.getAttribute('data-series')))),
  outside: Array.from(svg.querySelectorAll('.legend-item text, .row-label')).filter(e => {
    const r = e.getBoundingClientRect(), box = svg.getBoundingClientRect();
    return r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5; }).map(e => e.textContent),
}))"""


def _watch(page, problems: list[str]) -> None:
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: problems.append(f"fetched {r.url}") if not r.url.startswith(("file:", "data:", "about:")) else None)


def _listeners_catch_errors(browser) -> None:
    """The listeners hear a console error and an uncaught exception (else an empty list proves nothing)."""
    heard: list[str] = []
    probe = browser.new_page()
    _watch(probe, heard)
    probe.set_content("<script>console.error('probe: console'); window.setTimeout(function () { undefinedProbe(); }, 0);</script>")
    probe.wait_for_timeout(200)
    probe.close()
    assert any("probe: console" in h for h in heard) and any("undefinedProbe" in h for h in heard), heard


@contextlib.contextmanager
def open_page(profile: Path) -> Iterator[tuple[object, list[str]]]:
    """A fresh headless Chromium (its profile in ``profile``): ``(page, problems)``."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).is_file(), "chromium is missing: scripts/setup.sh installs it (apt-get install -y chromium)"
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                        viewport={"width": 1100, "height": 900}, args=FLAGS)
        try:
            _listeners_catch_errors(browser)
            page = browser.new_page()
            problems: list[str] = []
            _watch(page, problems)
            yield page, problems
        finally:
            browser.close()


def keep(path: Path, name: str) -> Path:
    """Copy a screenshot or page into test-artifacts/ under ``name``."""
    ARTIFACTS.mkdir(exist_ok=True)
    return Path(shutil.copy(path, ARTIFACTS / name))
