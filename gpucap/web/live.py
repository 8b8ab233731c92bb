"""Live pages: a page polls for its live parts naming the key of what it shows, and gets 204
while a fresh render would show the same, so nothing on screen moves (or is lost) without news.

The key is a digest of the rendered parts, less what changes with every render but means
nothing new: the masked CSRF token of each form and the words of relative times, which the
browser keeps ticking itself (``components/ago.html``, ``static/countdown.js``).
"""

import hashlib
import re

# A <time> element's words ("3 minutes ago") and a form's masked CSRF token.
_VOLATILE = re.compile(
    r"(<time\b[^>]*>)[^<]*(</time>)|(name=\"csrfmiddlewaretoken\" value=\")[^\"]*(\")"
)


def content_key(html: str, *extra: object) -> str:
    """What ``html`` shows (and ``extra``), as a short digest: equal keys, nothing new."""
    stable = _VOLATILE.sub(lambda m: "".join(g for g in m.groups() if g is not None), html)
    digest = hashlib.sha256(stable.encode())
    for part in extra:
        digest.update(b"\0" + repr(part).encode())
    return digest.hexdigest()[:20]
