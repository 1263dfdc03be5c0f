"""Types of the compiled scanner core (``_cscan.pyx``); see that file and :mod:`.picklekit`."""

from collections.abc import Callable, Sequence
from typing import Any

from .picklekit.nodes import Value
from .picklekit.walker import Walked

def walk_record(
    buf: Any, pos: int, end: int, w: Walked, release: Callable[[int], None] | None = None
) -> tuple[Value, int, int]: ...
def rewrite_span(
    read_at: Callable[[int, int], bytes],
    start: int,
    end: int,
    protocol: int,
    memo_base: int,
    shift: int,
    externals: Sequence[int],
    read_payload: Callable[[int, int, int], Any] | None = None,
    big: int = ...,
    head: bytes | None = None,
) -> tuple[bytearray, list[Any], int]: ...

SLOW: object

class Framing:
    def __init__(self, head: bytes, tail: bytes, hm: Any, tm: Any, bounds: Any) -> None: ...

class SpanLoader:
    def __init__(
        self,
        ends: Any,
        bases: Any,
        ext_offsets: Any,
        ext_keys: Any,
        heads: dict[tuple[int, ...], bytes | None],
        protocol: int,
        shift: int,
        loads: Callable[[bytearray], Any],
        hooked: Callable[[bytearray], Any] | None,
        stats: Any,
    ) -> None: ...
    at: int
    def identify(
        self,
        size: int,
        mtime_ns: int,
        ctime_ns: int,
        ino: int,
        stale: Callable[[str | None, int, list[int]], Exception],
    ) -> None: ...
    def bound(
        self, limit: int, deepest: int, recursive: bool, check: Callable[[Any, int], object]
    ) -> None: ...
    def plan(
        self,
        starts: Any,
        hows: list[int],
        ints: Any,
        intcols: list[int],
        items: list[tuple[Any, ...] | None],
        definers: dict[int, int],
        empty: Any,
    ) -> None: ...
    def load(self, fd: int, i: int, f: int, start: int) -> Any: ...
    def fill_rows(
        self,
        fd: int,
        rows: Any,
        fr: Framing,
        order: list[int],
        starts: list[int],
        ends: list[int],
        labels: list[int],
    ) -> int: ...
    def load_sample(self, fd: int, i: int, check: bool = False, name: int | None = None) -> Any: ...
    def load_samples(
        self,
        fd: int,
        items: list[int],
        labels: list[int],
        fallback: Callable[[int, int], Any],
    ) -> list[Any]: ...

def replayed_values() -> int: ...
def extent(buf: Any, pos: int, end: int) -> int: ...
def fill_examined(fd: int, out: Any, size: int, window: int, most: int, skip: int) -> int: ...
def gather(buf: Any, at: Any, rel: Any, release: Callable[[int], None] | None) -> Any: ...
def template_matches(
    buf: Any,
    st: Any,
    lengths: Any,
    cand: Any,
    length: int,
    rel: Any,
    template: Any,
    mask: Any,
    ats: Any,
    release: Callable[[int], None] | None,
) -> Any: ...

MEASURE_FALLBACK: object

def measure_tree(sample: Any, limit: int, deepest: int, recursive: bool) -> Any: ...
def leaf_total(sample: tuple[Any, ...]) -> Any: ...
def check_tree(sample: Any, limit: int, deepest: int, recursive: bool) -> Any: ...

# object fields decoded into a batch's columns (read.objectcolumns, read.objectdecoder)
OBJECT_TOKENS: dict[str, int]

class ObjectSpans:
    externals: dict[int, Any]
    def __init__(
        self,
        fd: int,
        loader: SpanLoader | None,
        starts: Any,
        ends: Any,
        bases: Any,
        shift: int,
        externals: dict[int, Any],
        mapped: Any = None,
    ) -> None: ...

class ObjectDecoder:
    schema: list[int] | None
    kinds: list[int] | None
    vals: Any
    objs: list[list[Any] | None] | None
    keys: list[Any] | None
    sizes: Any
    filled: Any
    size: int
    nleaves: int
    height: int
    def __init__(self, size: int, prior: ObjectDecoder | None = None) -> None: ...
    def decode(
        self,
        srcs: list[ObjectSpans],
        cuts: Any,
        items: Any,
        rows: Any,
        labels: Any,
        first: int,
        nbytes: Any,
    ) -> tuple[int, int, int, int, int]: ...
