"""Types of the compiled scanner core (``_cscan.pyx``); see that file and :mod:`.opcodes`."""

from typing import Any

from .opcodes import Value, Walked

def walk_record(buf: Any, pos: int, end: int, w: Walked) -> tuple[Value, int, int]: ...
