"""Hooks the hello plugin offers to *other* plugins.

Registered by :func:`rackboot_hello.plugin.rackboot_addhooks`. Hook names
carry the plugin's prefix (``hello_``) so they never clash with the core's
or another plugin's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from appliance.api import hookspec

if TYPE_CHECKING:
    from appliance.node import Node


@hookspec(firstresult=True)
def hello_greeting(node: Node, peer: str) -> str | None:
    """Choose the line the hello service sends to a client.

    :param node: The running node (``node.config`` holds the configuration).
    :param peer: The client's address, ``"host:port"``.
    :return: One line of text (without its newline), or ``None`` to let the
        next implementation decide.

    The first non-``None`` answer wins. The hello plugin's own implementation
    runs last and returns ``[hello] greeting``. Keep it cheap and free of side
    effects: it is called once per connection, inside the node's trio thread.
    """
