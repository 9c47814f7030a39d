"""Which worker process made an id: the first character of the id's random part.

With several worker processes behind one port (`--workers`), a call's later requests must
reach the process that holds it. Every id a worker makes (calls, telephony legs, ephemeral
secrets) starts its random part with that worker's tag, so any worker can name the owner
from the id alone. A single process sets no tag and its ids stay wholly random.

In a cluster (`--cluster`) the random part starts with the node's tag and then the worker's
(a single process is worker 0 there): any node names the owning node, and that node its
worker, from the id alone; the id keeps its length and alphabet.
"""

from __future__ import annotations

import secrets
import string

TAGS = string.digits + string.ascii_lowercase + string.ascii_uppercase  # 62 workers at most
_tag = ""
_node = ""  # this node's tag in a cluster ("": not in one)


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
    worker = "" if index is None else TAGS[index]
    _tag = _node + (worker or ("0" if _node else ""))


def set_node(tag: str) -> None:
    """Tag every id this process makes from now on with cluster node `tag` before the worker
    tag (a single process counts as worker 0)."""
    global _node, _tag
    if len(tag) != 1 or tag not in TAGS:
        raise ValueError(f"a node tag is one of {TAGS}")
    worker = _tag[len(_node):] or "0"
    _node = tag
    _tag = tag + worker


def node_tag() -> str:
    """This process's node tag ("": not in a cluster)."""
    return _node


def made_here(identifier: str, token_chars: int) -> bool:
    """`identifier` was made by this process (its node and worker tags are this one's)."""
    return bool(_tag) and identifier[-token_chars:].startswith(_tag)


def tagged_token(nbytes: int) -> str:
    """`secrets.token_urlsafe(nbytes)`, its first character replaced by this worker's tag."""
    token = secrets.token_urlsafe(nbytes)
    return _tag + token[len(_tag):]


def worker_of(identifier: str, token_chars: int) -> int | None:
    """The worker that made `identifier`, whose random part is its last `token_chars`
    characters; None when it cannot carry a tag."""
    offset = len(_node)  # in a cluster the worker tag follows the node tag
    if len(identifier) < token_chars:
        return None
    index = TAGS.find(identifier[-token_chars + offset])
    return index if index >= 0 else None


def node_of(identifier: str, token_chars: int) -> str | None:
    """The cluster node that made `identifier` (its tag), in a cluster; None otherwise."""
    if not _node or len(identifier) < token_chars:
        return None
    tag = identifier[-token_chars]
    return tag if tag in TAGS else None
