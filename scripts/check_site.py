"""Open the built course site in a real browser (headless Chromium, driven by Playwright) and check
what a reader would meet: every page loads, every image on it decodes, every link between the
site's pages (and to an anchor on one) resolves, and the search finds "chunked prefill".

    python scripts/check_site.py [--site site] [--browser /usr/bin/chromium]

The site is served on 127.0.0.1 for the check, as a reader's web server would serve it. Exits 1
with one line per problem; 2 when no browser is installed (Debian: `apt-get install chromium`).
"""

from __future__ import annotations

import argparse
import functools
import html.parser
import http.server
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

ROOT = Path(__file__).resolve().parents[1]
SEARCH = "chunked prefill"
SEARCH_FINDS = "notebooks/06_prefill_stalls_and_chunked_prefill.html"    # the notebook that teaches it
# As the machine's own probe starts it: no sandbox as root, no background connections to a network
# that is not there.
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]


class _Ids(html.parser.HTMLParser):
    """Every id and name="..." anchor of a page (the targets a #fragment may point at)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key == "id" or (tag == "a" and key == "name"):
                self.ids.add(value or "")


@functools.cache
def ids_of(path: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.ids)


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:       # (one line per file fetched is noise here)
        pass


def link_problems(site: Path, page: Path, hrefs: list[str], base: str) -> list[str]:
    """Links from ``page`` (its URL's ``hrefs``, resolved) to a file of the site that is not there, or
    to an anchor that page does not have."""
    problems = []
    for href in sorted(set(hrefs)):
        if not href.startswith(base):
            continue                                     # another site's page: not ours to check
        parts = urlsplit(href)
        target = site / unquote(parts.path[len(urlsplit(base).path):])
        if target.is_dir():
            target = target / "index.html"
        name = page.relative_to(site)
        if not target.is_file():
            problems.append(f"{name}: a link to {href[len(base):]}, which is not in the site")
        elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in ids_of(target):
            problems.append(f"{name}: a link to {href[len(base):]}, whose page has no #{parts.fragment}")
    return problems


def check(site: Path, browser: str, search: str = SEARCH, finds: str = SEARCH_FINDS) -> tuple[list[str], int]:
    """(problems, pages checked); the search for ``search`` must list the page ``finds``."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    pages = sorted(p for p in site.rglob("*.html") if "_static" not in p.parts and "_sources" not in p.parts)
    if not pages:
        return [f"no pages in {site} (build it: python scripts/build_site.py)"], 0
    server, base = serve(site)
    problems: list[str] = []
    try:
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=browser, args=BROWSER_ARGS)
            tab = chromium.new_page()
            failed: list[str] = []
            tab.on("requestfailed", lambda r: failed.append(r.url))
            for page in pages:
                failed.clear()
                url = urljoin(base, page.relative_to(site).as_posix())
                response = tab.goto(url, wait_until="load")
                name = page.relative_to(site)
                if response is None or not response.ok:
                    problems.append(f"{name}: HTTP {response.status if response else 'no response'}")
                    continue
                # Every image must decode: complete, with a width (a broken or missing one has none).
                broken = tab.eval_on_selector_all(
                    "img", "imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
                problems += [f"{name}: an image that does not decode: {src[:120]}" for src in broken]
                problems += [f"{name}: could not fetch {u[len(base):] if u.startswith(base) else u}"
                             for u in failed if u.startswith(base)]
                hrefs = tab.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
                problems += link_problems(site, page, hrefs, base)
            tab.goto(urljoin(base, f"search.html?q={search.replace(' ', '+')}"), wait_until="load")
            try:
                tab.wait_for_selector("#search-results ul.search li", timeout=20_000)
            except PlaywrightTimeout:
                pass                                     # no results: reported below
            found = tab.eval_on_selector_all("#search-results ul.search li a", "links => links.map(a => a.href)")
            if not any(finds in href for href in found):
                problems.append(f"the search for {search!r} did not find {finds} (it found {len(found)} "
                                f"results: {found[:5]})")
            chromium.close()
    finally:
        server.shutdown()
    return problems, len(pages)


def find_browser(given: str | None) -> str | None:
    return given or next((b for b in (shutil.which(n) for n in ("chromium", "chromium-browser")) if b), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT / "site", help="the built site (default site/)")
    parser.add_argument("--browser", help="the Chromium to drive (default: chromium on the PATH)")
    args = parser.parse_args(argv)
    browser = find_browser(args.browser)
    if browser is None:
        print("check_site: no Chromium found (Debian: apt-get install chromium; or --browser PATH)", file=sys.stderr)
        return 2
    problems, count = check(args.site, browser)
    if problems:
        print(f"check_site: {len(problems)} problems in {args.site}:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"check_site: {count} pages of {args.site} load in {Path(browser).name}, every image decodes, every "
          f"link between them resolves, and the search finds {SEARCH!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
