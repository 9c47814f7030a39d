"""Which worker process made an id: the first character of the id's random part.

With several worker processes behind one port (`--workers`), a call's later requests must
reach the process that holds it. Every id a worker makes (calls, telephony legs, ephemeral
secrets) starts its random part with that worker's tag, so any worker can name the owner
from the id alone. A single process sets no tag and its ids stay wholly random.
"""

from __future__ import annotations

import secrets
import string

TAGS = string.digits + string.ascii_lowercase + string.ascii_uppercase  # 62 workers at most
_tag = ""


def token_chars(nbytes: int) -> int:
    """How many characters `secrets.token_urlsafe(nbytes)` has (base64url, no padding)."""
    return -(-4 * nbytes // 3)


ID_TOKEN_BYTES = 18  # the random part of call and telephony leg ids
ID_TOKEN_CHARS = token_chars(ID_TOKEN_BYTES)


def set_worker(index: int | None) -> None:
    """Tag every id this process makes from now on with worker `index` (None: no tag)."""
    global _tag
    if index is not None and not 0 <= index < len(TAGS):
        raise ValueError(f"worker index must be 0-{len(TAGS) - 1}")
    _tag = "" if index is None else TAGS[index]


def tagged_token(nbytes: int) -> str:
    """`secrets.token_urlsafe(nbytes)`, its first character replaced by this worker's tag."""
    token = secrets.token_urlsafe(nbytes)
    return _tag + token[len(_tag):]


def worker_of(identifier: str, token_chars: int) -> int | None:
    """The worker that made `identifier`, whose random part is its last `token_chars`
    characters; None when it cannot carry a tag."""
    if len(identifier) < token_chars:
        return None
    index = TAGS.find(identifier[-token_chars])
    return index if index >= 0 else None
