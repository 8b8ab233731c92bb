"""The key a live page polls with (gpucap.web.live): the same for what shows the same, whatever
the clock says in relative words or the masked CSRF token of each render; different for
anything else."""

from gpucap.web.live import content_key

PAGE = (
    '<p>Made <time class="ago" datetime="2026-12-01T10:00:00Z" data-since="x">{ago}</time></p>'
    '<form><input type="hidden" name="csrfmiddlewaretoken" value="{token}"></form>'
    "<td>{held} GPUs</td>"
)


def test_relative_words_and_csrf_tokens_do_not_change_the_key():
    first = content_key(PAGE.format(ago="now", token="a1b2", held=8))
    later = content_key(PAGE.format(ago="3\xa0minutes ago", token="zz99", held=8))
    assert first == later


def test_anything_else_changes_the_key():
    base = content_key(PAGE.format(ago="now", token="a", held=8))
    assert content_key(PAGE.format(ago="now", token="a", held=4)) != base
    assert content_key(PAGE.format(ago="now", token="a", held=8), "step 2") != base
