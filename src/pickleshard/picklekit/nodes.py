"""The walker's model of the containers a pickle builds: nodes, kept as plain Python lists.

The opcode walker (:mod:`pickleshard.picklekit.walker`) pushes one value per value the unpickler
would push: an ``int`` (the start offset of an opaque value) or a node (a list, tuple or dict
whose items the scanner's layout matching needs). The helpers here move items between the stack
and nodes, keeping only two levels below any node on the stack.
"""

from __future__ import annotations

from array import array
from typing import Any

__all__ = ["BOUNDS", "DICT", "ITEMS", "KEY", "KIND", "LIST", "START", "SUB", "TUPLE"]
__all__ += ["Node", "Value", "adopt", "claim", "discard", "start_of"]

LIST, TUPLE, DICT = 1, 2, 3

# A node is a list, tuple or dict built on the scanner's stack, kept as a plain Python list
# (three times cheaper to make than an object) with these slots:
#   KIND    LIST, TUPLE or DICT
#   START   offset of the first opcode of the value
#   ITEMS   per item, its start offset (an int) or its own node; an array('q') of offsets
#           once the node is complete and itself an item of another node
#   BOUNDS  flat [count, end, count, end...]: after each batch (APPENDS, SETITEMS, TUPLE...) the
#           item count and the offset of the consuming opcode, which ends the batch's last item
#   SUB     indices of the items that are still nodes, or None. When a node becomes an item of
#           another, its own node items are turned into their start offsets: only two levels
#           below any node on the stack are kept, which is all a layout needs.
#   KEY     the memo key stored from this node, or -1
KIND, START, ITEMS, BOUNDS, SUB, KEY = range(6)
Node = list[Any]
Value = Any  # an int (start offset of an opaque value) or a Node


def start_of(v: Value) -> int:
    return v if type(v) is int else v[START]  # type: ignore[no-any-return,unused-ignore]


def prune(node: Node, memo_nodes: dict[int, Node]) -> None:
    sub = node[SUB]
    if sub:
        items = node[ITEMS]
        for idx in sub:
            g = items[idx]
            if type(g) is list:
                items[idx] = g[START]
                if g[KEY] >= 0:
                    memo_nodes.pop(g[KEY], None)
    node[SUB] = None


def claim(
    stack: list[Value], m: int, base: int, nodepos: list[int], memo: dict[int, Node]
) -> list[int]:
    """Nodes among ``stack[m:]`` become items (at ``base + j - m``) of another node: prune them."""
    sub = []
    while nodepos and nodepos[-1] >= m:
        j = nodepos.pop()
        kid = stack[j]
        prune(kid, memo)
        if len(kid[ITEMS]) > 4:  # complete now, and only ints: 8 bytes an item instead of ~40
            kid[ITEMS] = array("q", kid[ITEMS])
        sub.append(base + j - m)
    return sub


def adopt(
    target: Node, stack: list[Value], m: int, end: int, nodepos: list[int], memo: dict[int, Node]
) -> None:
    """Move ``stack[m:]`` into ``target``'s items; the last of them ends at ``end``."""
    items = target[ITEMS]
    if nodepos and nodepos[-1] >= m:
        if target[SUB] is None:
            target[SUB] = []
        target[SUB] += claim(stack, m, len(items), nodepos, memo)
    items += stack[m:]
    del stack[m:]
    target[BOUNDS] += (len(items), end)


def discard(stack: list[Value], m: int, nodepos: list[int], memo: dict[int, Node]) -> None:
    while nodepos and nodepos[-1] >= m:
        nd = stack[nodepos.pop()]
        if nd[KEY] >= 0:
            memo.pop(nd[KEY], None)
        prune(nd, memo)
    del stack[m:]
