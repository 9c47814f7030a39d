"""The one way the start-up checks of this package read aiortc's and aioice's code: the
source text of a function or class, or "" where Python cannot show it (a C extension, a
frozen or stripped install), which every check then reports as missing."""

from __future__ import annotations

import inspect
from typing import Any


def source_of(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""
