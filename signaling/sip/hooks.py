"""Handlers for requests inside dialogs the inbound core does not own.

The user agent's core (ua.py) serves the dialogs of inbound calls itself. Dialogs it did not
create (the agent's own outbound calls, outbound.py) and requests it does not serve on its
own (the NOTIFYs of a transfer, refer.py) are handed to whoever registered a hook for the
dialog: a hook answers the request on its server transaction and returns True, or returns
False to let the next hook, and then the core, take it. An ACK has no transaction: a dialog's
ACK hook (the ACK of a 2xx its owner sent to a re-INVITE) takes it and says whether it did.
"""

from __future__ import annotations

from collections.abc import Callable

from signaling.sip.dialog import DialogId
from signaling.sip.message import SipRequest
from signaling.sip.transaction import ServerTransaction

DialogHook = Callable[[SipRequest, ServerTransaction], bool]
AckHook = Callable[[SipRequest], bool]


class DialogHooks:
    def __init__(self) -> None:
        self._hooks: dict[DialogId, list[DialogHook]] = {}
        self._ack_hooks: dict[DialogId, AckHook] = {}

    def add(self, dialog: DialogId, hook: DialogHook) -> None:
        self._hooks.setdefault(dialog, []).append(hook)

    def remove(self, dialog: DialogId, hook: DialogHook) -> None:
        hooks = self._hooks.get(dialog)
        if hooks is None:
            return
        if hook in hooks:
            hooks.remove(hook)
        if not hooks:
            del self._hooks[dialog]

    def handle(self, dialog: DialogId, request: SipRequest, tx: ServerTransaction) -> bool:
        """Offer the request to the dialog's hooks, newest first; True once one took it."""
        for hook in reversed(list(self._hooks.get(dialog, ()))):
            if hook(request, tx):
                return True
        return False

    def set_ack(self, dialog: DialogId, hook: AckHook | None) -> None:
        """The dialog's ACK hook (one per dialog); None removes it."""
        if hook is None:
            self._ack_hooks.pop(dialog, None)
        else:
            self._ack_hooks[dialog] = hook

    def ack(self, dialog: DialogId, request: SipRequest) -> bool:
        hook = self._ack_hooks.get(dialog)
        return hook is not None and hook(request)

    def __contains__(self, dialog: object) -> bool:
        return dialog in self._hooks or dialog in self._ack_hooks

    def __len__(self) -> int:
        return (sum(len(hooks) for hooks in self._hooks.values())
                + len(self._ack_hooks))
