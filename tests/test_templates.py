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
