"""Templates render no stray template syntax: Django's ``{# #}`` comment is one line only, so a
comment wrapped over two lines would be printed on the page."""

import re
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


def test_no_template_has_a_one_line_comment_spread_over_lines():
    offenders = [
        f"{path.relative_to(TEMPLATES)}:{text[: match.start()].count(chr(10)) + 1}"
        for path in sorted(TEMPLATES.rglob("*.html"))
        for text in [path.read_text()]
        for match in re.finditer(r"\{#[^\n]*\n", text)
        if "#}" not in match.group(0)
    ]
    assert offenders == [], "use {% comment %} for comments over several lines"


def test_no_template_has_an_inline_script_event_handler_or_style_element():
    """The Content-Security-Policy allows scripts and styles from this site's files alone: an inline
    <script>, an on...= handler, an hx-on attribute (htmx would need eval) or a <style> element
    would be refused by the browser."""
    forbidden = re.compile(
        r"<script(?![^>]*\bsrc=)[^>]*>|\son[a-z]+\s*=|\bhx-on[:-]|<style\b|=[\"']javascript:",
        re.I,
    )
    comment = re.compile(r"\{% comment %\}.*?\{% endcomment %\}", re.S)
    blank = lambda found: "\n" * found.group(0).count("\n")  # noqa: E731 (keeps line numbers)
    offenders = [
        f"{path.relative_to(TEMPLATES)}:{text[: match.start()].count(chr(10)) + 1}: {match[0]}"
        for path in sorted(TEMPLATES.rglob("*.html"))
        for text in [comment.sub(blank, path.read_text())]
        for match in forbidden.finditer(text)
    ]
    assert offenders == [], "move it to a file under static/ (see static/gpucap.js)"


def test_no_form_widget_carries_an_inline_event_handler():
    """Widgets render HTML too: an ``on...`` attribute there is refused by the CSP as well."""
    code = Path(__file__).resolve().parents[1] / "gpucap"
    handler = re.compile(r"[\"']on[a-z]+[\"']\s*:")
    offenders = [
        f"{path.relative_to(code)}:{number}"
        for path in sorted(code.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if handler.search(line)
    ]
    assert offenders == [], "use a data- attribute read by static/gpucap.js"
