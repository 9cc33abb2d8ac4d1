"""Open every page of the built site in headless Chromium, offline, and fail on what a reader
would see broken.

    mkdocs build --strict --site-dir site && python tools/check_site.py site

The site is served on loopback and every other host is unreachable (Chromium's resolver maps
it to nothing). A page fails on:

* a console error (an uncaught exception, a resource that failed to load);
* a request to another host: a script, stylesheet, font, image or frame from outside the site;
* math that did not render: ``$$``, ``$\\command``, ``\\(`` or ``\\[`` left in the text, a formula MathJax did
  not typeset, or one it typeset as an error (a ``|`` that split a table cell, say);
* a broken image (its file is not in the site);
* a list run into the paragraph before it (Markdown needs a blank line before a list);
* an API signature line longer than 100 characters (mkdocstrings wraps signatures only when
  Ruff or Black is installed: the ``docs`` extra installs Ruff).

Chromium comes from the system (``apt-get install chromium`` on Debian); ``--chromium`` names
another binary.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

SKIPPED_TEXT = {"script", "style", "code", "pre", "svg", "mjx-container", "textarea", "kbd"}
RESOURCE_ATTRS = {("script", "src"), ("img", "src"), ("iframe", "src"), ("source", "src"), ("video", "src"),
                  ("audio", "src"), ("embed", "src"), ("object", "data")}
RAW_MATH = re.compile(r"\$\$|\$\\[A-Za-z{]|\\\(|\\\)|\\\[|\\\]")  # $$, $\cmd, \( \) \[ \]
RUN_IN_LIST = re.compile(r"\n\s*(?:[-*+]|\d+\.)\s+\S")
CONSOLE = re.compile(r":CONSOLE[:(].*?\]\s*(.*)$")
MAX_SIGNATURE_LINE = 100


class _Page(HTMLParser):
    """What the checks need from one page's HTML: its visible text (outside code and math),
    paragraphs, external and image references, and the math elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []
        self.paragraphs: list[str] = []
        self.resources: list[tuple[str, str]] = []
        self.images: list[str] = []
        self.math = self.math_rendered = self.math_errors = 0
        self.signatures: list[str] = []
        self._paragraph: list[str] | None = None
        self._math_depth: list[int] = []
        self._signature_depth: int | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag not in ("br", "img", "link", "meta", "input", "hr", "source", "col", "wbr", "area", "base", "embed"):
            self.stack.append(tag)
        if tag == "p":
            self._paragraph = []
        for t, attr in RESOURCE_ATTRS:
            if tag == t and a.get(attr):
                self.resources.append((tag, a[attr]))
        if tag == "link" and a.get("href") and set(a.get("rel", "").split()) & {"stylesheet", "icon", "preload",
                                                                                  "manifest", "modulepreload"}:
            self.resources.append((tag, a["href"]))
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag == "div" and "doc-signature" in a.get("class", "").split() and self._signature_depth is None:
            self._signature_depth = len(self.stack)
            self.signatures.append("")
        if "arithmatex" in a.get("class", "").split():
            self.math += 1
            self._math_depth.append(len(self.stack))
        if tag == "mjx-container" and self._math_depth:
            self.math_rendered += 1
        if tag == "mjx-merror" or "data-mjx-error" in a:
            self.math_errors += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self.stack:
            while self.stack and self.stack.pop() != tag:
                pass
        if self._math_depth and len(self.stack) < self._math_depth[-1]:
            self._math_depth.pop()
        if self._signature_depth is not None and len(self.stack) < self._signature_depth:
            self._signature_depth = None
        if tag == "p" and self._paragraph is not None:
            self.paragraphs.append("".join(self._paragraph))
            self._paragraph = None

    def handle_data(self, data: str) -> None:
        if self._signature_depth is not None:
            self.signatures[-1] += data
        if SKIPPED_TEXT & set(self.stack):
            return
        self.text.append(data)
        if self._paragraph is not None:
            self._paragraph.append(data)


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _render(chromium: str, url: str, timeout: float) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran (MathJax included), and its console messages."""
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--enable-logging=stderr", "--v=0",
               "--virtual-time-budget=15000", "--dump-dom", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    messages = [m.group(1) for line in done.stderr.splitlines() if (m := CONSOLE.search(line))]
    return done.stdout, messages


def check_page(site: Path, page: Path, base: str, chromium: str, timeout: float = 120) -> list[str]:
    """Everything wrong with one page (empty: nothing)."""
    url = urljoin(base, page.relative_to(site).as_posix())
    dom, console = _render(chromium, url, timeout)
    if not dom.strip():
        return ["Chromium returned no page"]
    parsed = _Page()
    parsed.feed(dom)
    problems = [f"console: {m}" for m in console
                if re.search(r"error|uncaught|failed to load|refused|exception", m, re.IGNORECASE)]
    for tag, ref in parsed.resources:
        host = urlparse(urljoin(url, ref)).hostname
        if host not in ("127.0.0.1", None):
            problems.append(f"<{tag}> loads from another host: {ref}")
    for src in parsed.images:
        target = urlparse(urljoin(url, src))
        if target.hostname == "127.0.0.1":
            path = site / target.path.lstrip("/")
            if not (path.is_file() or (path / "index.html").is_file()):
                problems.append(f"broken image: {src}")
    text = "".join(parsed.text)
    for match in RAW_MATH.finditer(text):
        context = text[max(0, match.start() - 40): match.end() + 40].replace("\n", " ")
        problems.append(f"unrendered math {match.group()!r} in: ...{context}...")
        break
    if parsed.math_rendered < parsed.math:
        problems.append(f"{parsed.math - parsed.math_rendered} of {parsed.math} formulas not typeset by MathJax")
    if parsed.math_errors:
        problems.append(f"{parsed.math_errors} formulas typeset as MathJax errors")
    for paragraph in parsed.paragraphs:
        match = RUN_IN_LIST.search(paragraph)
        if match:
            context = paragraph[max(0, match.start() - 50): match.end() + 30].replace("\n", " / ")
            problems.append(f"a list run into its paragraph (a blank line is missing before it): ...{context}...")
    for signature in parsed.signatures:
        long = [line for line in signature.splitlines() if len(line) > MAX_SIGNATURE_LINE]
        if long:
            problems.append(f"an API signature not wrapped ({len(long[0])} characters; is Ruff installed?): "
                            f"{long[0][:60]}...")
            break
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs build --site-dir ...)")
    parser.add_argument("--chromium", default=None, help="the browser binary (default: chromium on the PATH)")
    parser.add_argument("--pages", nargs="*", help="only these pages (paths relative to the site)")
    args = parser.parse_args(argv)
    chromium = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("no chromium on the PATH: apt-get install chromium, or pass --chromium", file=sys.stderr)
        return 2
    site = args.site.resolve()
    pages = [site / p for p in args.pages] if args.pages else sorted(site.rglob("*.html"))
    server, base = _serve(site)
    failed = 0
    try:
        for page in pages:
            problems = check_page(site, page, base, chromium)
            if problems:
                failed += 1
                print(f"FAIL {page.relative_to(site)}")
                for p in problems:
                    print(f"  - {p}")
    finally:
        server.shutdown()
    print(f"{len(pages) - failed} of {len(pages)} pages render cleanly offline")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
