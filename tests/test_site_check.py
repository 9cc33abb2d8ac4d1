"""tools/check_site.py, the browser check of the documentation, on pages with each fault it must
catch (skipped where Chromium is not installed; CI installs it)."""

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import check_site  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")]

PAGE = "<!doctype html><html><head><meta charset='utf-8'>{head}</head><body>{body}</body></html>"


def check(tmp_path, body, head=""):
    (tmp_path / "page.html").write_text(PAGE.format(head=head, body=body))
    server, base = check_site._serve(tmp_path)
    try:
        return check_site.check_page(tmp_path, tmp_path / "page.html", base, CHROMIUM)
    finally:
        server.shutdown()


def test_a_clean_page_passes(tmp_path):
    (tmp_path / "figure.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert check(tmp_path, "<p>Text, <code>$$x$$</code> in code is fine.</p><ul><li>a list</li></ul>"
                           "<img src='figure.png'><div class='doc-signature'><pre><code>f(\n    a: int,\n)"
                           "</code></pre></div>") == []


@pytest.mark.parametrize("body,head,expected", [
    ("<p>A formula $$x^2$$ left raw.</p>", "", "unrendered math '$$'"),
    ("<table><tr><td>$\\frac{1}{</td></tr></table>", "", "unrendered math '$\\\\f'"),
    ("<p>Display \\[ a \\] raw.</p>", "", "unrendered math"),
    ("<p><span class='arithmatex'>x</span></p>", "", "1 of 1 formulas not typeset by MathJax"),
    ("<p>A paragraph:\n* and a list run into it</p>", "", "a list run into its paragraph"),
    ("<img src='missing.png'>", "", "broken image: missing.png"),
    ("<p>x</p>", "<script src='https://cdn.example.org/lib.js'></script>", "loads from another host"),
    ("<script>undefinedFunction()</script>", "", "console: "),
    ("<div class='doc-signature highlight'><pre><code>f(" + ", ".join(f"a{i}: int = 0" for i in range(12))
     + ")</code></pre></div>", "", "an API signature not wrapped"),
])
def test_each_fault_fails_the_page(tmp_path, body, head, expected):
    problems = check(tmp_path, body, head)
    assert any(expected in p for p in problems), problems
