"""What the audit finds in one file: :class:`Audit` (every global named and called, where first)
and :class:`GlobalUse` (one global with its verdict), filled in by the walk of :mod:`.walk`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..allowlist import Verdict, classify_global

__all__ = ["UNRESOLVED", "Audit", "GlobalKey", "GlobalUse"]

GlobalKey = tuple[str, str]
UNRESOLVED: GlobalKey = ("?", "?")


@dataclass(frozen=True)
class GlobalUse:
    """One global a file names: ``refs`` opcodes name it, ``calls`` call or instantiate it."""

    module: str
    name: str
    refs: int
    calls: int
    verdict: Verdict

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "global": self.qualname,
            "module": self.module,
            "name": self.name,
            "refs": self.refs,
            "calls": self.calls,
            "verdict": self.verdict,
        }


@dataclass
class Audit:
    """What the audit walk found in one file.

    ``records`` holds ``(start, end after STOP)`` of each pickle; ``protocol`` is the first
    pickle's (0 or 1 when it has no ``PROTO`` opcode, by the opcodes it uses); ``opcodes`` the
    total opcode count; ``counts`` the count of each opcode in :data:`COUNTED` that occurs;
    ``computed_calls`` the calls made on values that no global names (results of other calls);
    ``bytes_read`` the bytes examined (payloads are seeked over); ``builds_on_globals`` the
    ``(offset, global)`` of each ``BUILD`` whose target is a global itself (directly or through
    the memo: a file changing a function or class of the loading process, which the loader
    refuses); ``first_refs`` the offset of the first opcode naming each global.
    """

    path: str
    size: int
    protocol: int = 0
    records: list[tuple[int, int]] = field(default_factory=list)
    opcodes: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    refs: dict[GlobalKey, int] = field(default_factory=dict)
    calls: dict[GlobalKey, int] = field(default_factory=dict)
    computed_calls: int = 0
    bytes_read: int = 0
    builds_on_globals: list[tuple[int, GlobalKey]] = field(default_factory=list)
    first_refs: dict[GlobalKey, int] = field(default_factory=dict)
    first_calls: dict[GlobalKey, int] = field(default_factory=dict)
    nested: list[tuple[int, str, Audit]] = field(default_factory=list)

    def globals(self, allow_globals: Iterable[GlobalKey] = ()) -> list[GlobalUse]:
        """Every global named, in order of first appearance, with its verdict."""
        extra = frozenset(allow_globals)
        out = []
        for key, n in self.refs.items():
            verdict: Verdict = "dangerous" if key == UNRESOLVED else classify_global(*key, extra)
            out.append(GlobalUse(key[0], key[1], n, self.calls.get(key, 0), verdict))
        return out
