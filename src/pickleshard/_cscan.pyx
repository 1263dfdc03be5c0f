# cython: language_level=3, boundscheck=True, wraparound=True, initializedcheck=True
"""The compiled twins of the pickle toolkit's walks; :mod:`pickleshard.picklekit` is the reference.

Every opcode is stepped over by :func:`_extent`, an inline C function, the twin of
:func:`pickleshard.picklekit.extent.extent`: same offsets, same codes, and the same errors, which
the Python side builds from them (:func:`pickleshard.picklekit.extent.extent_error`).

:func:`walk_record` is :func:`pickleshard.picklekit.walker.walk_record` line for line, with the opcode
byte, offsets and lengths held in C variables: same arguments, same nodes, same memo and GET
arrays, same exceptions (built by the same helpers, so class, message and offset match). Bytes
are read through a bounds-checked ``const unsigned char[:]`` view, and every length is compared
with the bytes left before it is used, as in the reference. A text memo id (``PUT``/``GET`` of
protocols 0-1) too large for a C integer raises ``walker.Unsupported``: the caller then walks
that pickle with the reference instead. One addition, with the same results: runs of values that
repeat the previous value's opcodes (a list of arrays) are replayed instead of walked (see
"template replay" below).
"""

cimport cython
from cpython cimport array
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy

import array as pyarray

from .picklekit import extent as ex
from .picklekit import nodes
from .picklekit import opcodes as oc
from .picklekit import renumber as rn
from .picklekit import walker as wk
from .picklekit.unpicklers import MemoIdPastSpan
from .errors import BoundExceeded

__all__ = [
    "MEASURE_FALLBACK",
    "SLOW",
    "Framing",
    "SpanLoader",
    "gather",
    "check_tree",
    "extent",
    "feistel_permute",
    "fill_examined",
    "leaf_total",
    "measure_tree",
    "node_spans",
    "rewrite_span",
    "template_matches",
    "walk_record",
    "walk_rows",
]

cdef enum:
    F_BAD, F_FIXED, F_LEN1, F_LEN4S, F_LEN4U, F_LEN8U, F_LINE, F_LINE2

cdef enum:
    A_BAD, A_PUSH, A_POPN, A_MARKPOP, A_NOP, A_FRAME, A_PROTO, A_STOP, A_MARK
    A_POP, A_POP_MARK, A_MEMOIZE, A_PUT, A_GET, A_EMPTY_LIST, A_EMPTY_DICT
    A_EMPTY_TUPLE, A_TUPLEN, A_TUPLE, A_LIST, A_DICT, A_APPEND, A_APPENDS
    A_SETITEM, A_SETITEMS, A_REFUSE

cdef enum:
    LIST = 1
    TUPLE = 2
    DICT = 3
    KIND = 0
    START = 1
    ITEMS = 2
    BOUNDS = 3
    SUB = 4
    KEY = 5
    RELEASE_SHIFT = 22
    MEMOIZE_OP = 0x94
    BINPUT_OP = 0x71
    LONG_BINPUT_OP = 0x72
    BINGET_OP = 0x68
    LONG_BINGET_OP = 0x6A
    STACK_GLOBAL_OP = 0x93

# a text memo id beyond this cannot take part in C arithmetic: leave that pickle to the reference
cdef int64_t ID_LIMIT = 1 << 62

cdef int FORM_[256]
cdef int ARGLEN_[256]
cdef int ACTION_[256]
cdef int NPOP_[256]
cdef int PUSH_STEP_[256]
cdef bint FINDS_CLASS_[256]
cdef bint NAME_TEXT_[256]


def _check_tables():
    """Copy the reference tables; refuse to load (ImportError: pure path) if the enums drifted."""
    forms = (oc.F_BAD, oc.F_FIXED, oc.F_LEN1, oc.F_LEN4S, oc.F_LEN4U, oc.F_LEN8U, oc.F_LINE,
             oc.F_LINE2)
    acts = (oc.A_BAD, oc.A_PUSH, oc.A_POPN, oc.A_MARKPOP, oc.A_NOP, oc.A_FRAME, oc.A_PROTO,
            oc.A_STOP, oc.A_MARK, oc.A_POP, oc.A_POP_MARK, oc.A_MEMOIZE, oc.A_PUT, oc.A_GET,
            oc.A_EMPTY_LIST, oc.A_EMPTY_DICT, oc.A_EMPTY_TUPLE, oc.A_TUPLEN, oc.A_TUPLE,
            oc.A_LIST, oc.A_DICT, oc.A_APPEND, oc.A_APPENDS, oc.A_SETITEM, oc.A_SETITEMS,
            oc.A_REFUSE)
    slots = (nodes.LIST, nodes.TUPLE, nodes.DICT, nodes.KIND, nodes.START, nodes.ITEMS,
             nodes.BOUNDS, nodes.SUB, nodes.KEY)
    ops = (oc.MEMOIZE_OP, oc.BINPUT_OP, oc.LONG_BINPUT_OP, oc.BINGET_OP, oc.LONG_BINGET_OP,
           wk.RELEASE_SHIFT)
    codes = (ex.CUT, ex.PAST_END, ex.NEGATIVE, ex.UNKNOWN, ex.SHORT)
    if (
        forms != tuple(range(8))
        or codes != (X_CUT, X_PAST_END, X_NEGATIVE, X_UNKNOWN, X_SHORT)
        or acts != tuple(range(26))
        or slots != (1, 2, 3, 0, 1, 2, 3, 4, 5)
        or ops != (0x94, 0x71, 0x72, 0x68, 0x6A, 22)
        or oc.STACK_GLOBAL_OP != 0x93
        or pyarray.array("q").itemsize != sizeof(long long)
    ):
        raise ImportError("pickleshard._cscan was built against other opcode tables")
    for b in range(256):
        FORM_[b], ARGLEN_[b], ACTION_[b] = oc.FORM[b], oc.ARGLEN[b], oc.ACTION[b]
        NPOP_[b], PUSH_STEP_[b] = oc.NPOP[b], oc.PUSH_STEP[b]
        if oc.HEAD[b] != 1 + ARGLEN_[b] and FORM_[b] != F_BAD:
            raise ImportError("pickleshard._cscan was built against other opcode tables")


_check_tables()


# -- the one stepper: the compiled twin of pickleshard.picklekit.extent.extent ---------------------

cdef enum:  # extent's codes (checked against the reference's above)
    X_CUT = -1  # the argument, length prefix or text line runs past ``end``
    X_PAST_END = -2  # the payload runs past ``end``
    X_NEGATIVE = -3  # BINSTRING's signed length is negative
    X_UNKNOWN = -4  # no such opcode
    X_SHORT = -5  # the fixed part or text line is past the ``avail`` bytes present, not ``end``


cdef inline uint64_t _le_at(const unsigned char* p, int n) noexcept nogil:
    """``n`` little-endian bytes at ``p`` (the caller has checked that they are there)."""
    cdef uint64_t v = 0
    cdef int i
    for i in range(n - 1, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef inline Py_ssize_t _extent(
    const unsigned char* b, Py_ssize_t avail, Py_ssize_t pos, Py_ssize_t end
) noexcept nogil:
    """:func:`pickleshard.picklekit.extent.extent` over the ``avail`` bytes at ``b``: the offset
    just after the opcode at ``b[pos]`` (``0 <= pos < min(avail, end)``), argument and payload
    included, at most ``end``; else an ``X_*`` code. Reads only ``b[pos:min(avail, end)]``."""
    cdef int op = b[pos]
    cdef int form = FORM_[op]
    cdef Py_ssize_t head, lim
    cdef uint64_t n
    cdef const unsigned char* nl
    if form == F_FIXED:
        head = pos + 1 + ARGLEN_[op]
        if head > end:
            return X_CUT
        return head if head <= avail else X_SHORT
    if form == F_LINE or form == F_LINE2:
        lim = end if end < avail else avail
        nl = <const unsigned char*>memchr(b + pos + 1, 10, <size_t>(lim - pos - 1))
        if nl != NULL and form == F_LINE2:
            nl = <const unsigned char*>memchr(nl + 1, 10, <size_t>(b + lim - nl - 1))
        if nl == NULL:
            return X_SHORT if avail < end else X_CUT
        return nl - b + 1
    if form == F_BAD:
        return X_UNKNOWN
    head = pos + 1 + ARGLEN_[op]
    if head > end:
        return X_CUT
    if head > avail:
        return X_SHORT
    if form == F_LEN1:
        n = b[pos + 1]
    elif form == F_LEN8U:
        n = _le_at(b + pos + 1, 8)
    else:
        n = _le_at(b + pos + 1, 4)
        if form == F_LEN4S and n >> 31:  # the sign bit of a 4-byte signed length
            return X_NEGATIVE
    if n > <uint64_t>(end - head):
        return X_PAST_END
    return head + <Py_ssize_t>n


def extent(object buf, Py_ssize_t pos, Py_ssize_t end):
    """:func:`_extent` over ``buf`` (for the twin tests): the same arguments and answers as
    :func:`pickleshard.picklekit.extent.extent`."""
    cdef const unsigned char[:] b = buf
    if not 0 <= pos < b.shape[0] or pos >= end:
        raise ValueError(f"extent at {pos} of a {b.shape[0]}-byte buffer ending at {end}")
    return _extent(&b[0], b.shape[0], pos, end)


# -- the bytes a scan examines, read with pread: a local file's scan without mapping it ----------

from libc.errno cimport EINTR, errno
from posix.unistd cimport pread as _pread

from os import strerror


cdef inline Py_ssize_t _learned(Py_ssize_t need, Py_ssize_t window) noexcept nogil:
    """The window after a skip: ``need`` (the bytes the last window held up to the skipped
    payload) doubled, rounded up to 32, from 32 to ``window``."""
    need = (2 * need + 31) // 32 * 32
    return window if need >= window else (need if need > 32 else 32)


cdef int _fill(
    int fd, unsigned char* out, Py_ssize_t lo, Py_ssize_t n, Py_ssize_t size, int64_t* got
) noexcept nogil:
    """Read ``[lo, min(lo + n, size))`` of ``fd`` into ``out + lo``: 0, an errno, or -1 when
    the file ends first (it shrank under the scan)."""
    cdef Py_ssize_t hi = lo + n if n < size - lo else size
    cdef ssize_t r
    while lo < hi:
        r = _pread(fd, out + lo, <size_t>(hi - lo), lo)
        if r < 0:
            if errno == EINTR:
                continue
            return errno
        if r == 0:
            return -1
        lo += r
        got[0] += r
    return 0


def fill_examined(
    int fd,
    object out,
    Py_ssize_t size,
    Py_ssize_t window,
    Py_ssize_t most,
    Py_ssize_t skip,
):
    """Read into ``out[:size]`` every byte a scan of the first ``size`` bytes of ``fd``
    examines (see :mod:`pickleshard.scan.sparse`): each opcode the chain of :func:`_extent`
    steps on from offset 0, its argument, and its payload when shorter than ``skip`` (a longer
    one is stepped over, unread). Reads are windows of ``window`` bytes at each place the chain
    lands, doubled up to ``most`` while the chain walks off their ends (small opcodes only);
    after a skip, the next window is what the last one needed (from where it was read to the
    skipped payload's head) doubled, rounded up to 32 bytes, from 32 to ``window``: a file of
    samples alike reads each sample's opcodes in one read of about their size (12 KB arrays:
    64 bytes a sample, not 256). Stops at bytes :func:`_extent` refuses: they are in
    ``out``, and the walk reports them. Other bytes of ``out`` are left as they were. Returns
    the bytes read; raises ``OSError`` when a read fails."""
    cdef unsigned char[::1] o = out
    if size < 0 or o.shape[0] < size or window < 16 or most < window:
        raise ValueError(f"fill of {size} bytes into a {o.shape[0]}-byte buffer")
    if size == 0:
        return 0
    cdef unsigned char* b = &o[0]
    cdef int64_t got = 0
    cdef int err
    with nogil:
        err = _fill_loop(fd, b, size, window, most, skip, &got)
    _raise_fill(err, size)
    return got


cdef int _raise_fill(int err, Py_ssize_t size) except -1:
    if err > 0:
        raise OSError(err, strerror(err))
    if err < 0:
        raise OSError(f"the file ended before byte {size} while it was scanned (it changed)")
    return 0


cdef int _fill_loop(
    int fd,
    unsigned char* b,
    Py_ssize_t size,
    Py_ssize_t window,
    Py_ssize_t most,
    Py_ssize_t skip,
    int64_t* got,
) noexcept nogil:
    """The loop of :func:`fill_examined`: 0, an errno, or -1 (the file ended first)."""
    cdef Py_ssize_t pos = 0, lo = 0, have = 0, nxt, w = window, payload
    cdef int err = 0, op
    while pos < size:
        if pos < lo or pos >= have:  # landed outside the window held: read one here
            if pos == have and pos:  # walked off its end: the next one larger
                w = w * 2 if w * 2 <= most else most
            err = _fill(fd, b, pos, w, size, got)
            if err:
                return err
            lo, have = pos, (pos + w if w < size - pos else size)
        nxt = _extent(b, have, pos, size)
        if nxt == X_SHORT:  # a text line or argument past the window: read on
            w = w * 2 if w * 2 <= most else most
            err = _fill(fd, b, have, w, size, got)
            if err:
                return err
            have = have + w if w < size - have else size
            continue
        if nxt < 0:
            return 0
        op = b[pos]
        if F_LEN1 <= FORM_[op] <= F_LEN8U:
            payload = nxt - pos - 1 - ARGLEN_[op]
            if payload >= skip:
                w = _learned(nxt - payload - lo, window)
            elif nxt > have:  # a short payload past the window: the scan reads it
                err = _fill(fd, b, have, nxt - have, size, got)
                if err:
                    return err
                have = nxt
        pos = nxt
    return 0


# -- a fill in a thread of its own: the next file's bytes read while the caller walks this one ----
#
# A plain C thread (pthread), never holding the GIL: a Python thread would need the GIL to start
# each fill and to return from it, and with the caller's walk holding it, each of those waits a
# switch interval (5 ms), longer than the fill (pickleshard.scan.ahead measures this).

cdef extern from *:
    """
    #include <pthread.h>
    #include <signal.h>
    #include <stdint.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    typedef struct ps_filler {
        pthread_mutex_t mu;
        pthread_cond_t cv;
        pthread_t th;
        int stop, busy;                 /* stop asked; a job given and not yet done */
        int fd, mode;                   /* the job */
        unsigned char *out;
        Py_ssize_t size, window, most, skip;
        int64_t got;                    /* its result */
        int err;
        long tid;                       /* the thread's id (for /proc/self/task/TID/io) */
        pid_t owner;                    /* the process that started it (a fork has no thread) */
        int (*run)(struct ps_filler *);
    } ps_filler;
    static void *ps_filler_main(void *arg) {
        ps_filler *f = (ps_filler *)arg;
        sigset_t all;
        int err;
        /* signals are the Python threads' business; faults in a copy stay with this thread */
        sigfillset(&all);
        sigdelset(&all, SIGBUS); sigdelset(&all, SIGSEGV);
        sigdelset(&all, SIGFPE); sigdelset(&all, SIGILL);
        pthread_sigmask(SIG_BLOCK, &all, NULL);
        pthread_mutex_lock(&f->mu);
        f->tid = (long)syscall(SYS_gettid);
        pthread_cond_broadcast(&f->cv);
        for (;;) {
            while (!f->stop && f->busy != 1) pthread_cond_wait(&f->cv, &f->mu);
            if (f->stop) break;
            pthread_mutex_unlock(&f->mu);
            err = f->run(f);
            pthread_mutex_lock(&f->mu);
            f->err = err;
            f->busy = 2;  /* done: the caller's wait takes it */
            pthread_cond_broadcast(&f->cv);
        }
        pthread_mutex_unlock(&f->mu);
        return NULL;
    }
    static int ps_filler_start(ps_filler *f, int (*run)(ps_filler *)) {
        int err;
        f->run = run;
        f->tid = 0;
        f->owner = getpid();
        if (pthread_mutex_init(&f->mu, NULL) != 0) return -1;
        if (pthread_cond_init(&f->cv, NULL) != 0) { pthread_mutex_destroy(&f->mu); return -1; }
        err = pthread_create(&f->th, NULL, ps_filler_main, f);
        if (err != 0) {
            pthread_cond_destroy(&f->cv); pthread_mutex_destroy(&f->mu);
            return err;
        }
        pthread_mutex_lock(&f->mu);
        while (f->tid == 0) pthread_cond_wait(&f->cv, &f->mu);
        pthread_mutex_unlock(&f->mu);
        return 0;
    }
    static void ps_filler_submit(ps_filler *f) {
        pthread_mutex_lock(&f->mu);
        f->busy = 1;
        f->got = 0;
        f->err = 0;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
    }
    static void ps_filler_wait(ps_filler *f) {
        pthread_mutex_lock(&f->mu);
        while (f->busy == 1) pthread_cond_wait(&f->cv, &f->mu);
        f->busy = 0;
        pthread_mutex_unlock(&f->mu);
    }
    /* whether this process started the thread: a forked child holds a copy of the struct (its
       mutex perhaps locked) and no thread, and must neither wait on it nor join it */
    static int ps_filler_ours(ps_filler *f) { return f->owner == getpid(); }
    static void ps_filler_stop(ps_filler *f) {
        if (!ps_filler_ours(f)) return;
        pthread_mutex_lock(&f->mu);
        f->stop = 1;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->th, NULL);
        pthread_cond_destroy(&f->cv);
        pthread_mutex_destroy(&f->mu);
    }
    """
    ctypedef struct ps_filler:
        int fd
        int mode
        unsigned char* out
        Py_ssize_t size
        Py_ssize_t window
        Py_ssize_t most
        Py_ssize_t skip
        int64_t got
        int err
        long tid
    ctypedef int (*ps_filler_run)(ps_filler*) noexcept nogil
    int ps_filler_start(ps_filler* f, ps_filler_run run) nogil
    void ps_filler_submit(ps_filler* f) nogil
    void ps_filler_wait(ps_filler* f) nogil
    void ps_filler_stop(ps_filler* f) nogil
    int ps_filler_ours(ps_filler* f) nogil


from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdlib cimport calloc, free

FILL_READ = 0  # pread at every place the chain lands (fill_examined)
FILL_WHOLE = 1  # the whole file, in 1 MiB reads (a dense file storage must deliver)
cdef enum:
    _WHOLE_PIECE = 1 << 20


cdef int _filler_run(ps_filler* f) noexcept nogil:
    cdef int64_t got = 0
    cdef int err = 0
    cdef Py_ssize_t pos = 0
    if f.mode == 1:
        while pos < f.size and err == 0:
            err = _fill(f.fd, f.out, pos, _WHOLE_PIECE, f.size, &got)
            pos += _WHOLE_PIECE
    else:
        err = _fill_loop(f.fd, f.out, f.size, f.window, f.most, f.skip, &got)
    f.got = got
    return err


cdef class FillThread:
    """A thread of its own (C, never holding the GIL) that fills a buffer as
    :func:`fill_examined` does (``mode`` :data:`FILL_READ`) or reads the file whole
    (:data:`FILL_WHOLE`), one fill at a time: :meth:`submit` starts one and returns,
    :meth:`wait` waits for it and returns its bytes read (or raises its ``OSError``). The buffer
    is held (it cannot be resized or closed) and the descriptor must stay open until then.
    ``tid``: the thread's id (its I/O counters are ``/proc/self/task/TID/io``)."""

    cdef ps_filler* f
    cdef Py_buffer view
    cdef bint holding
    cdef bint running

    def __cinit__(self):
        self.f = <ps_filler*>calloc(1, sizeof(ps_filler))
        if self.f == NULL:
            raise MemoryError()
        cdef int err = ps_filler_start(self.f, _filler_run)
        if err != 0:
            free(self.f)
            self.f = NULL
            raise OSError(err, "cannot start the fill thread")
        self.running = True

    @property
    def tid(self):
        return self.f.tid if self.running else None

    def submit(
        self,
        int fd,
        object out,
        Py_ssize_t size,
        int mode,
        Py_ssize_t window,
        Py_ssize_t most,
        Py_ssize_t skip,
    ):
        if not self.running:
            raise ValueError("the fill thread is closed")
        if not ps_filler_ours(self.f):
            raise ValueError("the fill thread belongs to the process this one was forked from")
        if self.holding:
            raise ValueError("a fill is in flight: wait() for it first")
        if size < 0 or window < 16 or most < window or mode not in (0, 1):
            raise ValueError(f"fill of {size} bytes, window {window}, mode {mode}")
        PyObject_GetBuffer(out, &self.view, PyBUF_WRITABLE)
        if self.view.len < size:
            PyBuffer_Release(&self.view)
            raise ValueError(f"fill of {size} bytes into a {self.view.len}-byte buffer")
        self.holding = True
        self.f.fd, self.f.mode, self.f.out = fd, mode, <unsigned char*>self.view.buf
        self.f.size, self.f.window, self.f.most, self.f.skip = size, window, most, skip
        with nogil:
            ps_filler_submit(self.f)

    def wait(self):
        if not self.holding:
            raise ValueError("no fill in flight")
        if not ps_filler_ours(self.f):  # (a fork while a fill was in flight: never done here)
            raise ValueError("the fill thread belongs to the process this one was forked from")
        with nogil:
            ps_filler_wait(self.f)
        self.holding = False
        PyBuffer_Release(&self.view)
        _raise_fill(self.f.err, self.f.size)
        return self.f.got

    def close(self):
        self._stop()

    def __dealloc__(self):
        self._stop()

    cdef void _stop(self) noexcept:
        """Stop the thread (a fill in flight ends first), let the buffer go, free the record."""
        if not self.running:
            return
        with nogil:
            ps_filler_stop(self.f)
        self.running = False
        if self.holding:
            self.holding = False
            PyBuffer_Release(&self.view)
        free(self.f)
        self.f = NULL


cdef inline uint64_t _le(const unsigned char[:] b, Py_ssize_t p, int n):
    """``n`` little-endian bytes at ``b[p:]`` (bounds-checked)."""
    cdef uint64_t v = 0
    cdef int i
    for i in range(n - 1, -1, -1):
        v = (v << 8) | b[p + i]
    return v


cdef inline int array_push(array.array a, long long v) except -1:
    cdef Py_ssize_t n = len(a)
    array.resize_smart(a, n + 1)
    a.data.as_longlongs[n] = v
    return 0


cdef inline object _start_of(object v):
    return v if type(v) is int else (<list>v)[START]


cdef void _prune(list node, dict memo) except *:
    cdef object sub = node[SUB]
    cdef object items, g
    if sub:
        items = node[ITEMS]
        for idx in sub:
            g = items[idx]
            if type(g) is list:
                items[idx] = (<list>g)[START]
                if (<list>g)[KEY] >= 0:
                    memo.pop((<list>g)[KEY], None)
    node[SUB] = None


cdef list _claim(list stack, Py_ssize_t m, Py_ssize_t base, list nodepos, dict memo):
    cdef list sub = []
    cdef Py_ssize_t j
    cdef list kid
    while nodepos and <Py_ssize_t>nodepos[len(nodepos) - 1] >= m:
        j = nodepos.pop()
        kid = stack[j]
        _prune(kid, memo)
        if len(kid[ITEMS]) > 4:
            kid[ITEMS] = pyarray.array("q", kid[ITEMS])
        sub.append(base + j - m)
    return sub


cdef void _adopt(
    list target, list stack, Py_ssize_t m, Py_ssize_t end, list nodepos, dict memo
) except *:
    cdef object items = target[ITEMS]
    if nodepos and <Py_ssize_t>nodepos[len(nodepos) - 1] >= m:
        if target[SUB] is None:
            target[SUB] = []
        target[SUB] += _claim(stack, m, len(items), nodepos, memo)
    items += stack[m:]
    del stack[m:]
    target[BOUNDS] += (len(items), end)


cdef void _discard(list stack, Py_ssize_t m, list nodepos, dict memo) except *:
    cdef list nd
    while nodepos and <Py_ssize_t>nodepos[len(nodepos) - 1] >= m:
        nd = stack[<Py_ssize_t>nodepos.pop()]
        if nd[KEY] >= 0:
            memo.pop(nd[KEY], None)
        _prune(nd, memo)
    del stack[m:]


cdef int64_t _text_id(object buf, Py_ssize_t pos, Py_ssize_t nxt, int op, object w) except? -1:
    cdef object mid = wk.memo_arg(buf, pos, nxt, op, w)
    if not -ID_LIMIT < mid < ID_LIMIT:
        raise wk.Unsupported(f"memo id {mid} at byte {pos}")
    return mid


# -- template replay: the one thing the compiled walk does that the reference does not ---------
#
# A list of N arrays (or any values the walk keeps as a bare offset) is N runs of the same
# opcodes: in protocols 4-5 (MEMOIZE, no explicit memo ids) the runs differ only in payload
# bytes. When the value on top of the stack started at ``s``, nothing above it or inside it is
# open (no MARK, no node, no pending POP), and the bytes from ``pos`` on repeat ``[s, pos)``
# outside its payloads, walking them would do exactly what walking ``[s, pos)`` did, shifted by
# ``pos - s``: the same memo definitions and GETs (same keys), the same payload skips, one more
# offset on the stack. The replay records those effects without stepping through the opcodes.
# Templates are refused when they hold anything whose walk depends on more than their bytes: a
# FRAME or PROTO, an explicit PUT, POPs, text opcodes, a GET of a key defined inside them or of
# a container the walk tracks. The twin tests check that both walks give equal results.

cdef enum:
    TPL_MIN = 24  # shorter values are walked: a replay would not pay for its checks


cdef Py_ssize_t _replayed = 0  # values replayed in this process (for tests and benchmarks)


def replayed_values():
    """How many values walks in this process have replayed instead of stepping through."""
    return _replayed


cdef class _Tpl:
    cdef Py_ssize_t s, nops, paysum, gops
    cdef bytes head  # the template's bytes outside payloads and FRAME headers, concatenated
    cdef array.array ops  # per opcode: _OP_* fields
    cdef array.array at  # scratch: where each opcode stands in the bytes being compared


cdef enum:  # the fields of one opcode in _Tpl.ops
    OP_HLEN = 0  # its bytes, payload excluded
    OP_PLEN = 1  # its payload's length
    OP_HOFF = 2  # where its bytes are in head
    OP_KIND = 3  # K_PLAIN, K_DEF or K_GET
    OP_KEY = 4  # the key a GET reads
    OP_FIELDS = 5
    K_PLAIN = 0
    K_DEF = 1
    K_GET = 2
    FRAME_OP = 0x95


cdef _Tpl _template(
    const unsigned char[:] b, Py_ssize_t s, Py_ssize_t pos, array.array defs,
    array.array goffs, array.array gkeys, dict memo,
):
    """The template of value ``[s, pos)`` (just walked), or None if it cannot be replayed."""
    cdef Py_ssize_t i = s, hdr, nxt, j, nd, ng, d0, g0, hoff = 0
    cdef uint64_t n
    cdef int op, form, act, kind
    cdef long long key
    cdef _Tpl t = _Tpl()
    t.s, t.nops, t.paysum, t.gops = s, 0, 0, 0
    t.ops = pyarray.array("q")
    parts = []
    j = len(defs)
    while j > 0 and defs.data.as_longlongs[j - 1] >= s:
        j -= 1
    d0, nd = j, len(defs) - j
    j = len(goffs)
    while j > 0 and goffs.data.as_longlongs[j - 1] >= s:
        j -= 1
    g0, ng = j, len(goffs) - j
    while i < pos:
        op = b[i]
        form, act = FORM_[op], ACTION_[op]
        kind, key, n = K_PLAIN, 0, 0
        if act == A_FRAME:  # a FRAME header: replays skip those where they find them
            if i + 9 > pos:
                return None
            i += 9
            continue
        if act in (A_PROTO, A_STOP, A_PUT, A_POP, A_POP_MARK, A_REFUSE, A_BAD):
            return None
        nxt = _extent(&b[0], b.shape[0], i, pos)
        if nxt < 0:
            return None
        hdr = 1 + ARGLEN_[op]  # the opcode's bytes, its payload (n bytes after them) excluded
        if FINDS_CLASS_[op]:
            t.gops += 1
        if form == F_FIXED:
            if act == A_MEMOIZE:
                if nd == 0 or defs.data.as_longlongs[len(defs) - nd] != i:
                    return None
                kind, nd = K_DEF, nd - 1
            elif act == A_GET:
                if ng == 0 or goffs.data.as_longlongs[len(goffs) - ng] != i:
                    return None
                key = gkeys.data.as_longlongs[len(goffs) - ng]
                if key >= d0 or key in memo:  # refers to itself, or to a tracked container
                    return None
                kind, ng = K_GET, ng - 1
        elif F_LEN1 <= form <= F_LEN8U:
            n = <uint64_t>(nxt - i - hdr)
            t.paysum += <Py_ssize_t>n
        else:  # text arguments (memo ids in digits): walked, not replayed
            return None
        for v in (hdr, <Py_ssize_t>n, hoff, kind, key):
            array_push(t.ops, v)
        parts.append(bytes(b[i : i + hdr]))
        hoff += hdr
        t.nops += 1
        i = nxt
    if i != pos or nd or ng or t.nops == 0:
        return None
    t.head = b"".join(parts)
    t.at = pyarray.array("q", [0]) * t.nops
    return t


cdef Py_ssize_t _replay(
    _Tpl t, const unsigned char[:] b, Py_ssize_t pos, Py_ssize_t end, list stack,
    array.array defs, array.array goffs, array.array gkeys, object release, uint64_t* skipped,
    Py_ssize_t* gops,
) except -1:
    """Replay ``t`` from ``pos`` for as long as the bytes repeat it (FRAME headers between its
    opcodes allowed, as the pickler puts them anywhere); return where that stops: a value the
    walk has to read itself starts there."""
    global _replayed
    cdef const char* head = t.head
    cdef const long long* ops = t.ops.data.as_longlongs
    cdef long long* at = t.at.data.as_longlongs
    cdef Py_ssize_t nops = t.nops, k, p, hlen, plen
    cdef const long long* o
    cdef uint64_t fn
    while True:
        p = pos
        for k in range(nops):  # compare first: a value that differs anywhere is not replayed
            o = ops + k * OP_FIELDS
            while p < end and b[p] == FRAME_OP:  # a FRAME header the pickler put here
                if 9 > end - p:
                    return pos
                fn = _le(b, p + 1, 8)
                if fn > <uint64_t>(end - p - 9):
                    return pos  # the walk names the cut frame
                p += 9
            hlen, plen = o[OP_HLEN], o[OP_PLEN]
            if hlen + plen > end - p or memcmp(&b[p], head + o[OP_HOFF], hlen) != 0:
                return pos
            at[k] = p
            p += hlen + plen
        for k in range(nops):
            o = ops + k * OP_FIELDS
            if o[OP_KIND] == K_DEF:
                array_push(defs, at[k])
            elif o[OP_KIND] == K_GET:
                array_push(goffs, at[k])
                array_push(gkeys, o[OP_KEY])
            elif o[OP_PLEN] and release is not None:
                if (at[k] + o[OP_HLEN] + o[OP_PLEN]) >> RELEASE_SHIFT != at[k] >> RELEASE_SHIFT:
                    release(at[k])
        skipped[0] += t.paysum
        gops[0] += t.gops
        stack.append(at[0])
        _replayed += 1
        pos = p


def walk_record(object buf, Py_ssize_t pos, Py_ssize_t end, object w, object release=None):
    """:func:`pickleshard.picklekit.walker.walk_record`, compiled: walk one pickle from just
    after its PROTO to its STOP; return ``(root, end, first id)``."""
    cdef const unsigned char[:] b = buf
    if end > b.shape[0] or pos < 0:
        raise ValueError(f"walk of [{pos}, {end}) over a buffer of {b.shape[0]} bytes")
    cdef Py_ssize_t avail = b.shape[0]
    cdef const unsigned char* bp = &b[0] if avail else NULL  # _extent reads b[:end] through it
    cdef array.array defs = w.defs
    cdef array.array goffs = w.get_offs
    cdef array.array gkeys = w.get_keys
    cdef array.array named = w.named  # the audit's facts (see picklekit.walker.Walked)
    cdef dict strs = w.strs
    cdef object opa, opb
    cdef list stack = []
    cdef list nodepos = []
    cdef list marks = []
    cdef list moffs = []
    cdef dict memo = {}
    cdef Py_ssize_t key0 = len(defs)
    cdef Py_ssize_t fence = 0, m, lo, nxt, k, moff
    cdef int64_t first_id = -1, carry = -1, mid, s, start
    cdef uint64_t n, skipped = 0
    cdef int op, step, act, want, kind
    cdef object top, target, items, sub
    cdef list node
    cdef _Tpl tpl = None
    cdef Py_ssize_t nst, s_top, tpl_failed = -1, moved, gops = 0
    while True:
        if pos >= end:
            raise wk.cut_error(w, pos, "the opcode stream (no STOP)")
        nst = PyList_GET_SIZE(stack)
        if nst > fence and carry < 0:  # a value just ended? then the next may repeat it
            top = <object>PyList_GET_ITEM(stack, nst - 1)
            if type(top) is int:
                s_top = top
                if (
                    pos - s_top >= TPL_MIN
                    and b[pos] == b[s_top]
                    and s_top != tpl_failed
                    and (not moffs or <Py_ssize_t>moffs[len(moffs) - 1] < s_top)
                ):
                    if tpl is None or tpl.s != s_top:
                        tpl = _template(b, s_top, pos, defs, goffs, gkeys, memo)
                        if tpl is None:
                            tpl_failed = s_top
                    if tpl is not None:
                        moved = _replay(
                            tpl, b, pos, end, stack, defs, goffs, gkeys, release, &skipped, &gops
                        )
                        if moved != pos:
                            pos = moved
                            continue
        op = b[pos]
        step = PUSH_STEP_[op]
        if step:
            stack.append(pos)
            pos += step
            continue
        if op == MEMOIZE_OP:
            if len(stack) <= fence:
                raise wk.bad_error(w, pos, op, "with nothing on the stack")
            if first_id:
                if first_id > 0:
                    raise wk.Refused("MEMOIZE after PUTs that did not start at id 0", pos)
                first_id = 0
            top = stack[len(stack) - 1]
            k = len(defs)
            if type(top) is list:
                memo[k] = top
                (<list>top)[KEY] = k
            elif NAME_TEXT_[b[<Py_ssize_t>top]]:
                strs[k] = top
            array_push(defs, pos)
            pos += 1
            continue
        nxt = _extent(bp, avail, pos, end)
        if nxt < 0:
            raise ex.extent_error(nxt, buf, pos, end, w.name)
        if F_LEN1 <= FORM_[op] <= F_LEN8U:  # every length-prefixed opcode pushes one value
            skipped += <uint64_t>(nxt - pos - 1 - ARGLEN_[op])
            if release is not None and nxt >> RELEASE_SHIFT != pos >> RELEASE_SHIFT:
                release(pos)
            stack.append(pos)
            pos = nxt
            continue
        act = ACTION_[op]
        if FINDS_CLASS_[op]:
            gops += 1
            opa = opb = -1
            nst = PyList_GET_SIZE(stack)
            if op == STACK_GLOBAL_OP and nst >= 2:
                opa = <object>PyList_GET_ITEM(stack, nst - 2)
                opb = <object>PyList_GET_ITEM(stack, nst - 1)
            array_push(named, pos)
            array_push(named, opa if type(opa) is int else -1)
            array_push(named, opb if type(opb) is int else -1)
        if act == A_GET:
            if op == BINGET_OP:
                mid = b[pos + 1]
            elif op == LONG_BINGET_OP:
                mid = <int64_t>_le(b, pos + 1, 4)
            else:
                mid = _text_id(buf, pos, nxt, op, w)
            k = mid - first_id + key0
            if first_id < 0 or not key0 <= k < len(defs):
                why = f"GET of memo id {mid}, never stored in this pickle (a Pickler reused?)"
                raise wk.Refused(why, pos)
            array_push(goffs, pos)
            array_push(gkeys, k)
            start = pos if carry < 0 else carry
            carry = -1
            target = memo.get(k)
            if target is None:
                stack.append(start)
            else:  # the same list/tuple/dict again: share its items
                nodepos.append(len(stack))
                stack.append([target[KIND], start, target[ITEMS], target[BOUNDS], target[SUB], -1])
        elif act == A_MARK:
            fence = len(stack)
            marks.append(fence)
            moffs.append(pos)
        elif A_APPEND <= act <= A_SETITEMS:  # APPEND, APPENDS, SETITEM, SETITEMS
            if act == A_APPENDS or act == A_SETITEMS:
                if not marks:
                    raise wk.bad_error(w, pos, op, "without a MARK")
                m = marks.pop()
                moffs.pop()
                fence = marks[len(marks) - 1] if marks else 0
            else:
                m = len(stack) - (1 if act == A_APPEND else 2)
            if m < 1 or m <= fence:
                raise wk.bad_error(w, pos, op, "with no container below its items")
            target = stack[m - 1]
            want = LIST if act <= A_APPENDS else DICT
            if (
                type(target) is not list
                or (<list>target)[KIND] != want
                or (want == DICT and (len(stack) - m) % 2)
            ):
                _discard(stack, m, nodepos, memo)  # a subclass built by REDUCE: items not tracked
            elif nodepos and <Py_ssize_t>nodepos[len(nodepos) - 1] >= m:
                _adopt(<list>target, stack, m, pos, nodepos, memo)
            else:
                items = (<list>target)[ITEMS]
                items += stack[m:]
                del stack[m:]
                (<list>target)[BOUNDS] += (len(items), pos)
        elif A_EMPTY_LIST <= act <= A_EMPTY_TUPLE:
            nodepos.append(len(stack))
            kind = LIST if act == A_EMPTY_LIST else DICT if act == A_EMPTY_DICT else TUPLE
            stack.append([kind, pos, [], [], None, -1])
        elif act == A_TUPLEN or act == A_POPN:
            m = len(stack) - NPOP_[op]
            if m < fence:
                raise wk.bad_error(w, pos, op, "underflows the stack")
            target = _start_of(stack[m])
            if act == A_POPN:
                _discard(stack, m, nodepos, memo)
                stack.append(target)
            else:
                sub = (
                    _claim(stack, m, 0, nodepos, memo)
                    if nodepos and <Py_ssize_t>nodepos[len(nodepos) - 1] >= m
                    else None
                )
                node = [TUPLE, target, stack[m:], [len(stack) - m, pos], sub, -1]
                del stack[m:]
                nodepos.append(m)
                stack.append(node)
        elif act == A_PUT:
            if len(stack) <= fence:
                raise wk.bad_error(w, pos, op, "with nothing on the stack")
            if op == BINPUT_OP:
                mid = b[pos + 1]
            elif op == LONG_BINPUT_OP:
                mid = <int64_t>_le(b, pos + 1, 4)
            else:
                mid = _text_id(buf, pos, nxt, op, w)
            k = len(defs)
            if first_id < 0:
                first_id = mid
            elif mid != first_id + k - key0:
                raise wk.Refused(f"memo id {mid} stored out of order", pos)
            top = stack[len(stack) - 1]
            if type(top) is list:
                memo[k] = top
                (<list>top)[KEY] = k
            elif NAME_TEXT_[b[<Py_ssize_t>top]]:
                strs[k] = top
            array_push(defs, pos)
        elif act == A_TUPLE or act == A_LIST or act == A_DICT or act == A_MARKPOP:
            if not marks:
                raise wk.bad_error(w, pos, op, "without a MARK")
            m = marks.pop()
            moff = moffs.pop()
            fence = marks[len(marks) - 1] if marks else 0
            if act == A_MARKPOP:  # e.g. FROZENSET, ADDITEMS, OBJ: an opaque value
                lo = m - NPOP_[op]
                if lo < fence:
                    raise wk.bad_error(w, pos, op, "underflows the stack")
                target = _start_of(stack[lo]) if lo < m else moff
                _discard(stack, lo, nodepos, memo)
                stack.append(target)
            else:
                kind = TUPLE if act == A_TUPLE else LIST if act == A_LIST else DICT
                if kind == DICT and (len(stack) - m) % 2:
                    raise wk.bad_error(w, pos, op, "with an odd number of items")
                node = [kind, moff, [], [], None, -1]
                _adopt(node, stack, m, pos, nodepos, memo)
                nodepos.append(len(stack))
                stack.append(node)
        elif act == A_PUSH:
            stack.append(pos)
        elif act == A_FRAME:
            n = _le(b, pos + 1, 8)
            if n > <uint64_t>(end - pos - 9):
                raise wk.cut_error(w, pos, f"a FRAME of {n} bytes")
        elif act == A_STOP:
            if len(stack) != 1 or marks:
                raise wk.Refused(f"{len(stack)} values and {len(marks)} marks at STOP", pos)
            w.skipped += skipped
            w.global_ops += gops
            return stack[0], nxt, max(first_id, 0)
        elif act == A_POP or act == A_POP_MARK:  # only a recursive tuple: POPs, then a GET
            if act == A_POP and len(stack) > fence:
                s = _start_of(stack[len(stack) - 1])
                _discard(stack, len(stack) - 1, nodepos, memo)
            elif marks:
                m = marks.pop()
                s = moffs.pop()
                fence = marks[len(marks) - 1] if marks else 0
                _discard(stack, m, nodepos, memo)
            else:
                raise wk.bad_error(w, pos, op, "on an empty stack")
            carry = s if carry < 0 else min(carry, s)
            if wk.next_action(buf, nxt, end) not in (A_POP, A_POP_MARK, A_GET):
                raise wk.Refused(f"{oc.OPNAME[op]} not followed by a GET", pos)
        elif act == A_PROTO:
            if b[pos + 1] > oc.HIGHEST_PROTOCOL:
                raise wk.bad_error(w, pos, op, f"names unknown protocol {b[pos + 1]}")
        elif act == A_REFUSE:
            raise wk.Refused(oc.REFUSED[op], pos)
        pos = nxt


# -- item spans of nodes: the compiled twin of pickleshard.scan.matching.spans -----------------


def node_spans(list nodes, long long[::1] starts, long long[::1] ends):
    """:func:`pickleshard.scan.matching.spans`, compiled: fill ``starts`` and ``ends`` (each as
    long as the nodes' items together) with each item's start offset and where it ends (the
    next item's start, or the batch's consuming opcode for a batch's last item)."""
    cdef Py_ssize_t total = starts.shape[0], base = 0, j, k, cnt, prev, nb
    cdef object items, x, bounds
    cdef list node
    cdef const long long[:] arr
    if ends.shape[0] != total:
        raise ValueError("starts and ends differ in length")
    for nd in nodes:
        node = <list>nd
        items = node[ITEMS]
        if type(items) is pyarray.array:
            arr = items
            if base + arr.shape[0] > total:
                raise ValueError("more items than starts")
            for j in range(arr.shape[0]):
                starts[base + j] = arr[j]
            base += arr.shape[0]
        else:
            if base + len(<list>items) > total:
                raise ValueError("more items than starts")
            for x in <list>items:
                starts[base] = x if type(x) is int else (<list>x)[START]
                base += 1
    if base != total:
        raise ValueError("fewer items than starts")
    for j in range(total - 1):
        ends[j] = starts[j + 1]
    base = 0
    for nd in nodes:
        node = <list>nd
        bounds = node[BOUNDS]
        nb = len(bounds)
        prev = 0
        for k in range(0, nb - 1, 2):
            cnt = bounds[k]
            if cnt > prev:
                if not 0 < base + cnt <= total:
                    raise ValueError("a batch count past the items")
                ends[base + cnt - 1] = bounds[k + 1]
            prev = cnt
        base += len(node[ITEMS])


# -- the row pass: a file that is one list of flat rows, walked without a node per value -------
#
# The common layout of a file of Python objects is one list of rows, each a dict (fixed keys)
# or a tuple, whose values are scalars, strings, memo GETs or lists of those. walk_record
# builds a Python list per container and an int per value for it, and the matching then reads
# those back row by row. walk_rows walks the same opcodes and keeps what the scan's result is
# made of, in C arrays: every row's item spans, exactly as node_spans gives them from
# walk_record's nodes, and the same memo definitions, GETs and memoized strings in ``w``. Any
# opcode or shape it does not know (a global, a nested dict, a GET of a container, anything
# walk_record would refuse or raise for) makes it return None with ``w`` as it was: the caller
# then walks the file with walk_record, which gives the same answer or the error.

from libc.stdlib cimport free, realloc

cdef enum:
    R_SCALAR = 0  # a value kept as its offset
    R_LIST = 1  # a list whose items are scalars (not tracked: only its start matters)
    R_DICT = 2  # a row: a dict
    R_TROW = 3  # a row: a tuple
    R_ROOT = 4  # the top-level list


cdef struct _Pairs:  # a growable array of (a, b) int64 pairs
    int64_t* a
    int64_t* b
    Py_ssize_t n, cap


cdef int _pairs_push(_Pairs* s, int64_t a, int64_t b) except -1:
    cdef Py_ssize_t cap
    cdef int64_t* na
    cdef int64_t* nb
    if s.n == s.cap:
        cap = s.cap * 2 if s.cap else 64
        na = <int64_t*>realloc(s.a, cap * sizeof(int64_t))
        if na == NULL:
            raise MemoryError()
        s.a = na
        nb = <int64_t*>realloc(s.b, cap * sizeof(int64_t))
        if nb == NULL:
            raise MemoryError()
        s.b = nb
        s.cap = cap
    s.a[s.n] = a
    s.b[s.n] = b
    s.n += 1
    return 0


cdef inline bint _all_of(_Pairs* st, Py_ssize_t lo, int k1, int k2) noexcept:
    """Whether every stack entry from ``lo`` on is of kind ``k1`` or ``k2``."""
    cdef Py_ssize_t j
    for j in range(lo, st.n):
        if st.b[j] != k1 and st.b[j] != k2:
            return False
    return True


cdef int _items_out(
    _Pairs* st, Py_ssize_t m, Py_ssize_t pos, array.array starts, array.array ends
) except -1:
    """Stack entries ``[m, top]`` as one batch of a row's items: each ends where the next
    starts, the last at ``pos`` (the opcode that consumed the batch)."""
    cdef Py_ssize_t j
    for j in range(m, st.n):
        array_push(starts, st.a[j])
        array_push(ends, st.a[j + 1] if j + 1 < st.n else pos)
    return 0


def walk_rows(object buf, Py_ssize_t pos, Py_ssize_t end, object w, object release=None):
    """Walk one pickle from just after its PROTO, as :func:`walk_record` does, if it is a list
    of rows (all dicts, or all tuples of one length) of scalars and lists of scalars; else
    return None, ``w`` untouched. Returns ``(kind, row_ends, sizes, item_starts, item_ends,
    end, first id)``: ``kind`` 3 (dict rows) or 2 (tuple rows); ``row_ends`` where each row ends
    in the top-level list (as :func:`node_spans` of the root gives it); ``sizes`` each row's
    item count (a dict's keys and values); ``item_starts``/``item_ends`` the rows' items one
    after another, as :func:`node_spans` of the row nodes gives them (int64 ``array``\\ s).
    ``w``'s memo definitions, GETs, memoized strings and skipped bytes grow as walk_record's
    would."""
    cdef const unsigned char[:] b = buf
    if end > b.shape[0] or pos < 0:
        raise ValueError(f"walk of [{pos}, {end}) over a buffer of {b.shape[0]} bytes")
    cdef Py_ssize_t avail = b.shape[0]
    cdef const unsigned char* bp = &b[0] if avail else NULL
    cdef array.array defs = w.defs
    cdef array.array goffs = w.get_offs
    cdef array.array gkeys = w.get_keys
    cdef dict strs = w.strs
    cdef Py_ssize_t key0 = len(defs), n_gets = len(goffs)
    cdef array.array row_ends = pyarray.array("q")
    cdef array.array sizes = pyarray.array("q")
    cdef array.array starts = pyarray.array("q")
    cdef array.array ends = pyarray.array("q")
    cdef _Pairs st  # the stack: (start offset, R_* kind)
    cdef _Pairs marks  # (stack height, MARK offset)
    cdef _Pairs boxes  # per memo key from key0: (1 if it stores a container, 0)
    st.a = st.b = marks.a = marks.b = boxes.a = boxes.b = NULL
    st.n = st.cap = marks.n = marks.cap = boxes.n = boxes.cap = 0
    cdef Py_ssize_t fence = 0, m, nxt, k, j, nrows = 0, width = -1
    cdef int64_t first_id = -1, mid, kind, row_kind = 0
    cdef uint64_t n, skipped = 0
    cdef int op, step, act, nst
    cdef bint done = False
    try:
        while True:
            if pos >= end:
                return None
            op = b[pos]
            step = PUSH_STEP_[op]
            if step:
                _pairs_push(&st, pos, R_SCALAR)
                pos += step
                continue
            if op == MEMOIZE_OP:
                if st.n <= fence or first_id > 0:
                    return None
                first_id = 0
                k = len(defs)
                kind = st.b[st.n - 1]
                if kind == R_SCALAR and NAME_TEXT_[b[st.a[st.n - 1]]]:
                    strs[k] = st.a[st.n - 1]
                _pairs_push(&boxes, kind != R_SCALAR, 0)
                array_push(defs, pos)
                pos += 1
                continue
            nxt = _extent(bp, avail, pos, end)
            if nxt < 0:
                return None
            if F_LEN1 <= FORM_[op] <= F_LEN8U:
                skipped += <uint64_t>(nxt - pos - 1 - ARGLEN_[op])
                if release is not None and nxt >> RELEASE_SHIFT != pos >> RELEASE_SHIFT:
                    release(pos)
                _pairs_push(&st, pos, R_SCALAR)
                pos = nxt
                continue
            act = ACTION_[op]
            if FINDS_CLASS_[op] or FORM_[op] == F_LINE or FORM_[op] == F_LINE2:
                return None  # a global (the audit's walk), or protocol 0-1 text: walk_record's
            if act == A_GET:
                if op == BINGET_OP:
                    mid = b[pos + 1]
                elif op == LONG_BINGET_OP:
                    mid = <int64_t>_le(b, pos + 1, 4)
                else:
                    return None
                k = mid - first_id + key0
                if first_id < 0 or not key0 <= k < len(defs) or boxes.a[k - key0]:
                    return None  # not stored, or a container again: walk_record's nodes
                array_push(goffs, pos)
                array_push(gkeys, k)
                _pairs_push(&st, pos, R_SCALAR)
            elif act == A_PUT:
                if st.n <= fence:
                    return None
                if op == BINPUT_OP:
                    mid = b[pos + 1]
                elif op == LONG_BINPUT_OP:
                    mid = <int64_t>_le(b, pos + 1, 4)
                else:
                    return None
                k = len(defs)
                if first_id < 0:
                    first_id = mid
                elif mid != first_id + k - key0:
                    return None
                kind = st.b[st.n - 1]
                if kind == R_SCALAR and NAME_TEXT_[b[st.a[st.n - 1]]]:
                    strs[k] = st.a[st.n - 1]
                _pairs_push(&boxes, kind != R_SCALAR, 0)
                array_push(defs, pos)
            elif act == A_MARK:
                fence = st.n
                _pairs_push(&marks, fence, pos)
            elif act == A_EMPTY_LIST:
                _pairs_push(&st, pos, R_ROOT if st.n == 0 and nrows == 0 else R_LIST)
            elif act == A_EMPTY_DICT:
                if st.n == 0 or st.b[st.n - 1] < R_DICT:
                    return None  # a dict inside a row
                nrows += 1
                array_push(sizes, 0)
                _pairs_push(&st, pos, R_DICT)
            elif act == A_APPEND or act == A_APPENDS or act == A_SETITEM or act == A_SETITEMS:
                if act == A_APPENDS or act == A_SETITEMS:
                    if marks.n == 0:
                        return None
                    marks.n -= 1
                    m = marks.a[marks.n]
                    fence = marks.a[marks.n - 1] if marks.n else 0
                else:
                    m = st.n - (1 if act == A_APPEND else 2)
                if m < 1 or m <= fence:
                    return None
                kind = st.b[m - 1]
                if act == A_APPEND or act == A_APPENDS:
                    if kind == R_LIST and _all_of(&st, m, R_SCALAR, R_SCALAR):
                        pass
                    elif kind == R_ROOT and m == 1 and _all_of(&st, m, R_DICT, R_TROW):
                        for j in range(m, st.n):  # rows: all dicts, or all tuples
                            if row_kind == 0:
                                row_kind = st.b[j]
                            elif st.b[j] != row_kind:
                                return None
                            array_push(row_ends, st.a[j + 1] if j + 1 < st.n else pos)
                    else:
                        return None
                else:
                    # a row's items: rows are made only above the root and stay on the stack
                    # until the root takes them, so with nothing but values above it this row
                    # is the newest: its items follow the earlier rows' in the flat arrays
                    if kind != R_DICT or (st.n - m) % 2 or not _all_of(&st, m, R_SCALAR, R_LIST):
                        return None
                    _items_out(&st, m, pos, starts, ends)
                    sizes.data.as_longlongs[nrows - 1] += st.n - m
                st.n = m
            elif act == A_TUPLEN or act == A_TUPLE:
                if act == A_TUPLE:
                    if marks.n == 0:
                        return None
                    marks.n -= 1
                    m = marks.a[marks.n]
                    mid = marks.b[marks.n]  # the tuple starts at its MARK
                    fence = marks.a[marks.n - 1] if marks.n else 0
                else:
                    m = st.n - NPOP_[op]
                    if m < fence:
                        return None
                    mid = st.a[m] if m < st.n else -1
                if (
                    m == st.n
                    or m < 1
                    or st.b[m - 1] < R_DICT
                    or not _all_of(&st, m, R_SCALAR, R_LIST)
                ):
                    return None  # an empty tuple, or a tuple inside a row
                if width < 0:
                    width = st.n - m
                elif width != st.n - m:
                    return None  # rows of several lengths: walk_record's nodes decide
                _items_out(&st, m, pos, starts, ends)
                array_push(sizes, st.n - m)
                nrows += 1
                st.n = m
                _pairs_push(&st, mid, R_TROW)
            elif act == A_FRAME:
                n = _le(b, pos + 1, 8)
                if n > <uint64_t>(end - pos - 9):
                    return None
            elif act == A_STOP:
                if st.n != 1 or marks.n or st.b[0] != R_ROOT or nrows == 0:
                    return None
                if len(row_ends) != nrows:
                    return None
                done = True
                w.skipped += skipped
                return (
                    3 if row_kind == R_DICT else 2,
                    row_ends, sizes, starts, ends, nxt, max(first_id, 0),
                )
            elif act == A_PUSH:
                _pairs_push(&st, pos, R_SCALAR)
            elif act != A_NOP:
                return None  # anything else: walk_record's to walk (or refuse)
            pos = nxt
    finally:
        free(st.a)
        free(st.b)
        free(marks.a)
        free(marks.b)
        free(boxes.a)
        free(boxes.b)
        if not done:  # w as it was: walk_record starts again from the same state
            for k in range(key0, len(defs)):
                strs.pop(k, None)
            del defs[key0:], goffs[n_gets:], gkeys[n_gets:]


# -- the span rewrite: the compiled twin of pickleshard.picklekit.rewrite.rewrite_span ---------

from cpython.bytearray cimport (
    PyByteArray_AS_STRING,
    PyByteArray_FromStringAndSize,
    PyByteArray_Resize,
)
from cpython.bytes cimport PyBytes_AS_STRING

import pickle
from struct import error as struct_error

cdef int COPY_STEP_[256]
cdef int PAYLOAD_[256]
for _b in range(256):
    COPY_STEP_[_b], PAYLOAD_[_b] = oc.COPY_STEP[_b], oc.PAYLOAD[_b]
    FINDS_CLASS_[_b] = oc.FINDS_CLASS[_b]
    NAME_TEXT_[_b] = oc.NAME_TEXT[_b]

cdef enum:
    P_BYTES = 1
    P_BYTEARRAY = 2
    WINDOW = 64 * 1024
    NEXT_BUFFER_OP = 0x97
    STOP_OP = 0x2E

if (oc.P_BYTES, oc.P_BYTEARRAY, oc.NEXT_BUFFER_OP, oc.STOP_OP) != (1, 2, 0x97, 0x2E):
    raise ImportError("pickleshard._cscan was built against other opcode tables")

cdef object _head = None  # picklekit.rewrite._head, _GETS, _PUTS, _encode_get, _encode_put (first call)
cdef list _gets = None, _puts = None
cdef dict _heads = {}  # (protocol, n_ext) -> _head(protocol, n_ext), for n_ext < 64
cdef object _encode_get = None, _encode_put = None
cdef object _past_span = None  # picklekit.rewrite.MemoIdPastSpan (first call)
cdef object _step_error = None  # picklekit.rewrite._step_error (first call)


cdef int _put_bytes(bytearray out, bytes b) except -1:
    """``out += b``."""
    cdef Py_ssize_t n0 = len(out), n = len(b)
    PyByteArray_Resize(out, n0 + n)
    memcpy(PyByteArray_AS_STRING(out) + n0, PyBytes_AS_STRING(b), n)
    return 0


cdef int _put_id(bytearray out, unsigned char short_op, int64_t ident) except -1:
    """``BINGET``/``BINPUT`` (``short_op``) of ``ident``, or ``LONG_BINGET``/``LONG_BINPUT``
    from 256 on: what ``picklekit.rewrite._encode_get`` / ``_encode_put`` write."""
    cdef Py_ssize_t n0 = len(out), j
    cdef char* p
    if ident < 256:
        PyByteArray_Resize(out, n0 + 2)
        p = PyByteArray_AS_STRING(out) + n0
        p[0], p[1] = <char>short_op, <char>ident
        return 0
    if ident >= 1 << 32:
        raise struct_error("'I' format requires 0 <= number <= 4294967295")
    PyByteArray_Resize(out, n0 + 5)
    p = PyByteArray_AS_STRING(out) + n0
    p[0] = <char>(LONG_BINGET_OP if short_op == BINGET_OP else LONG_BINPUT_OP)
    for j in range(4):
        p[1 + j] = <char>((ident >> (8 * j)) & 0xFF)
    return 0


cdef int _put_byte(bytearray out, unsigned char c) except -1:
    """``out.append(c)``."""
    cdef Py_ssize_t n0 = len(out)
    PyByteArray_Resize(out, n0 + 1)
    PyByteArray_AS_STRING(out)[n0] = <char>c
    return 0


cdef int _copy(bytearray out, const unsigned char[:] b, Py_ssize_t lo, Py_ssize_t hi) except -1:
    """Append ``b[lo:hi]`` to ``out``."""
    cdef Py_ssize_t n0 = len(out)
    if hi <= lo:
        return 0
    if lo < 0 or hi > b.shape[0]:
        raise IndexError(f"copy of [{lo}, {hi}) from a window of {b.shape[0]} bytes")
    PyByteArray_Resize(out, n0 + hi - lo)
    memcpy(PyByteArray_AS_STRING(out) + n0, &b[lo], hi - lo)
    return 0


def rewrite_span(
    object read_at,
    Py_ssize_t start,
    Py_ssize_t end,
    int protocol,
    object memo_base,
    object shift,
    object externals,
    object read_payload=None,
    Py_ssize_t big=64 * 1024,
    object head=None,
):
    """:func:`pickleshard.picklekit.rewrite.rewrite_span`, compiled: same arguments, same reads, same
    pickle, buffers and count, same exceptions."""
    return _rewrite(
        read_at, read_at(start, min(end - start, WINDOW)), start, end, protocol, memo_base,
        shift, externals, read_payload, big, head,
    )


cdef tuple _rewrite(
    object read_at,
    object data,
    Py_ssize_t start,
    Py_ssize_t end,
    int protocol,
    object memo_base,
    object shift,
    object externals,
    object read_payload,
    Py_ssize_t big,
    object head,
    dict local=None,
):
    """:func:`rewrite_span` once ``data``, the first window (``read_at(start, min(end - start,
    WINDOW))``), is read; ``local`` (None: built here) is ``{key: j for j, key in
    enumerate(externals)}``."""
    global _head, _gets, _puts, _encode_get, _encode_put, _past_span, _step_error
    if _head is None:
        _gets, _puts, _encode_get, _encode_put, _head = (
            rn.GETS, rn.PUTS, rn.encode_get, rn.encode_put, rn.proto_head
        )
        _past_span, _step_error = MemoIdPastSpan, rn.step_error
    cdef Py_ssize_t n_ext = len(externals)
    if local is None:
        local = {k: j for j, k in enumerate(externals)} if n_ext else {}
    if head is None:
        head = _heads.get((protocol, n_ext)) if n_ext < 64 else None
    if head is None:
        head = _head(protocol, n_ext)
        if n_ext < 64:
            _heads[(protocol, n_ext)] = head
    cdef bytes prologue = head
    cdef bytearray out = PyByteArray_FromStringAndSize(
        PyBytes_AS_STRING(prologue), len(prologue)
    )
    cdef Py_ssize_t finds = 0
    cdef list buffers = []
    cdef list gets = _gets, puts = _puts
    # memo base and shift as C ints when they fit (they always do for a real file's spans)
    # (within 2**61 each, so n_ext + id + shift - memo_base cannot overflow 64 bits)
    cdef bint fast_ids = -ID_LIMIT // 2 < memo_base < ID_LIMIT // 2 and (
        -ID_LIMIT // 2 < shift < ID_LIMIT // 2
    )
    cdef int64_t c_base = memo_base if fast_ids else 0, c_shift = shift if fast_ids else 0
    cdef int64_t ckey, cnew
    # a span's own ids: fewer than its bytes (see picklekit.unpicklers.MemoIdPastSpan)
    cdef int64_t c_limit = n_ext + (end - start)
    cdef Py_ssize_t here = start, blen, i = 0, mark = 0, need, nxt
    cdef uint64_t n
    cdef int op, step, form, act
    cdef object ident, key, new
    cdef const unsigned char[:] buf = data
    blen = buf.shape[0]
    cdef const unsigned char* bp = &buf[0] if blen else NULL  # _extent reads buf through it
    while True:
        if i >= blen:  # window done; a plain opcode or payload may run on into the next one
            _copy(out, buf, mark, blen)
            here += blen
            if here >= end:
                if here > end or i > blen:
                    raise EOFError(f"an opcode runs past the span end {end}")
                break
            i -= blen
            data = read_at(here, min(end - here, max(WINDOW, i + 16)))
            buf = data
            blen, mark = buf.shape[0], 0
            bp = &buf[0] if blen else NULL
            if not blen:
                raise EOFError(f"file ends at byte {here}, inside a span ending at {end}")
            continue
        op = buf[i]
        step = COPY_STEP_[op]
        if step:
            i += step
            continue
        nxt = _extent(bp, blen, i, end - here)
        if nxt == X_SHORT:  # the opcode's head is cut by the window: read again from it
            need = 1 + ARGLEN_[op] if FORM_[op] <= F_LEN8U else blen - i + WINDOW
            _copy(out, buf, mark, i)
            here += i
            data = read_at(here, min(end - here, max(WINDOW, 2 * need)))
            buf = data
            blen, i, mark = buf.shape[0], 0, 0
            bp = &buf[0] if blen else NULL
            if blen < min(end - here, need):
                raise EOFError(f"file ends at byte {here + blen}, inside a span ending at {end}")
            continue
        if nxt < 0:
            raise _step_error(nxt, data, i, here, end)
        form = FORM_[op]
        if F_LEN1 <= form <= F_LEN8U:
            n = <uint64_t>(nxt - i - 1 - ARGLEN_[op])
            if (
                nxt > blen
                and n >= <uint64_t>big
                and read_payload is not None
                and (PAYLOAD_[op] == P_BYTES or PAYLOAD_[op] == P_BYTEARRAY)
            ):
                _copy(out, buf, mark, i)
                _put_byte(out, NEXT_BUFFER_OP)
                buffers.append(read_payload(here + nxt - <Py_ssize_t>n, n, PAYLOAD_[op]))
                here += nxt  # resume after the payload, in a new window
                data = read_at(here, min(end - here, WINDOW))
                buf = data
                blen, i, mark = buf.shape[0], 0, 0
                bp = &buf[0] if blen else NULL
                continue
            i = nxt
            continue
        need = nxt - i
        if FINDS_CLASS_[op]:
            finds += 1
        act = ACTION_[op]
        if act == A_GET or act == A_PUT or act == A_FRAME:
            _copy(out, buf, mark, i)
            mark = nxt
            if act != A_FRAME and form == F_FIXED and fast_ids:
                # binary ids: C arithmetic (text ids of protocols 0-1 may be any size: below)
                ckey = (buf[i + 1] if need == 2 else <int64_t>_le(buf, i + 1, 4)) + c_shift
                if act == A_GET and ckey < c_base:
                    cnew = local[ckey]
                else:
                    cnew = n_ext + ckey - c_base
                if cnew < 0:  # a PUT below the span's first id: the file changed since the scan
                    raise pickle.UnpicklingError(
                        f"{oc.OPNAME[op]} at byte {here + i} stores memo id {ckey - c_shift} "
                        "below the span's"
                    )
                if cnew >= c_limit:
                    raise _past_span(op, here + i, ckey - c_shift, start, end)
                _put_id(out, (BINGET_OP if act == A_GET else BINPUT_OP), cnew)
            elif act != A_FRAME:
                if form == F_LINE or form == F_LINE2:  # a text id may be as long as a binary one
                    ident = int(data[i + 1 : nxt - 1])
                elif need == 2:
                    ident = buf[i + 1]
                else:
                    ident = _le(buf, i + 1, 4)
                key = ident + shift
                new = local[key] if act == A_GET and key < memo_base else n_ext + key - memo_base
                if new < 0:  # a PUT below the span's first id: the file changed since the scan
                    raise pickle.UnpicklingError(
                        f"{oc.OPNAME[op]} at byte {here + i} stores memo id {ident} below the span's"
                    )
                if new >= c_limit:
                    raise _past_span(op, here + i, ident, start, end)
                if new < 256:
                    _put_bytes(out, gets[new] if act == A_GET else puts[new])
                else:
                    _put_bytes(out, _encode_get(new) if act == A_GET else _encode_put(new))
        i = nxt
    _put_byte(out, STOP_OP)
    return out, buffers, finds


# -- one sample read and loaded in one call: SpanReader's compiled read path ----------------------

from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.exc cimport PyErr_SetFromErrno
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_FromLongLong
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from posix.stat cimport fstat, struct_stat
from posix.uio cimport iovec, preadv
from libc.stdlib cimport calloc, free, malloc
from posix.unistd cimport pread

SLOW = object()  # SpanLoader's answer when the caller must take its own (Python) path

cdef enum:  # how a field is read: read.plan's SPAN, ROW, ITEM, INT
    H_SPAN = 0
    H_ROW = 1
    H_ITEM = 2
    H_INT = 3

cdef enum:
    FILL_IOV = 1024  # IOV_MAX on Linux: the most pieces one preadv of fill_into gathers
    FILL_GAP_MAX = 1 << 20  # the largest gap between spans fill_into reads through
    FILL_READ_MAX = 1 << 26  # one preadv of fill_into stops growing here (Linux caps a read at 2 GiB)
    TPL_MAX = 512  # scan.model.MAX_TEMPLATE: an array item's framing outside its payload, at most


cdef class Framing:
    """An array item's framing (``ArrayItem.head``, ``tail``, masked ranges, FRAME bounds) in
    C arrays, every range checked against the template's length once, here."""
    cdef bytes head, tail
    cdef Py_ssize_t hlen, tlen
    cdef array.array hm, tm, bounds  # flat [lo, hi) pairs; FRAME header positions in tail
    # the same as C pointers (the bytes and arrays above own them, never resized), so that a
    # check runs without the GIL and without a Python attribute lookup per sample
    cdef const unsigned char* hp
    cdef const unsigned char* tp
    cdef const long long* hmp
    cdef const long long* tmp
    cdef const long long* bp
    cdef Py_ssize_t nhm, ntm, nb
    # no masked ranges: a sample's framing is the template byte for byte, one memcmp each side
    cdef bint exact

    def __init__(self, bytes head, bytes tail, hm, tm, bounds):
        self.head, self.tail, self.hlen, self.tlen = head, tail, len(head), len(tail)
        self.hm = pyarray.array("q", [int(v) for v in hm])
        self.tm = pyarray.array("q", [int(v) for v in tm])
        self.bounds = pyarray.array("q", [int(v) for v in bounds])
        if (
            self.hlen + self.tlen > TPL_MAX
            or len(self.hm) % 2
            or len(self.tm) % 2
            or not all(0 <= self.hm[j] < self.hm[j + 1] <= self.hlen for j in range(0, len(self.hm), 2))
            or not all(0 <= self.tm[j] < self.tm[j + 1] <= self.tlen for j in range(0, len(self.tm), 2))
            or not all(0 <= b <= self.tlen for b in self.bounds)
        ):
            raise ValueError("an array item's framing does not fit its template")
        self.hp, self.tp = <const unsigned char*><const char*>self.head, <const unsigned char*><const char*>self.tail
        self.hmp, self.tmp = self.hm.data.as_longlongs, self.tm.data.as_longlongs
        self.bp = self.bounds.data.as_longlongs
        self.nhm, self.ntm, self.nb = len(self.hm), len(self.tm), len(self.bounds)
        self.exact = self.nhm == 0 and self.ntm == 0

    cdef inline bint _same(
        self, unsigned char* buf, const unsigned char* want, Py_ssize_t n, const long long* m,
        Py_ssize_t nm,
    ) noexcept nogil:
        """Whether ``buf[:n]`` is ``want`` outside the ``nm / 2`` masked ranges ``m`` (copied
        over in ``buf``)."""
        cdef Py_ssize_t j
        for j in range(0, nm, 2):
            memcpy(buf + m[j], want + m[j], <size_t>(m[j + 1] - m[j]))
        return memcmp(buf, want, <size_t>n) == 0

    cdef bint matches(self, unsigned char* hb, unsigned char* tb, Py_ssize_t after) noexcept nogil:
        """Whether a sample's ``hlen`` bytes before its payload (``hb``) and ``after`` bytes
        after it (``tb``) are the template's: ``ArrayItem.framing_matches``."""
        cdef unsigned char ub[TPL_MAX]
        cdef Py_ssize_t j, b
        if self.exact and after == self.tlen:  # the common case: two compares
            return (
                memcmp(hb, self.hp, <size_t>self.hlen) == 0
                and memcmp(tb, self.tp, <size_t>self.tlen) == 0
            )
        if not self._same(hb, self.hp, self.hlen, self.hmp, self.nhm):
            return False
        if after == self.tlen:
            return self._same(tb, self.tp, self.tlen, self.tmp, self.ntm)
        if after != self.tlen + 9:
            return False
        for j in range(self.nb):  # the one FRAME header the pickler may have put here
            b = self.bp[j]
            if tb[b] == FRAME_OP:
                memcpy(ub, tb, <size_t>b)
                memcpy(ub + b, tb + b + 9, <size_t>(self.tlen - b))
                if self._same(ub, self.tp, self.tlen, self.tmp, self.ntm):
                    return True
        return False


# -- copies out of a file's mapping that survive the file shrinking under them -------------------
#
# A mapped page past the end of a file that was cut short since it was mapped raises SIGBUS on
# access. SpanLoader._fill copies out of a mapping only inside ps_copy_guarded: SIGBUS there jumps
# back out of the copy (the call returns -1 and the caller reads that sample its own way, which
# names the error); SIGBUS anywhere else goes to the handler that was there before ours.

cdef extern from *:
    """
    #include <setjmp.h>
    #include <signal.h>
    #include <string.h>
    static __thread sigjmp_buf *volatile ps_jump = NULL;  /* volatile: the stores around the copy must happen */
    static struct sigaction ps_previous;
    static void ps_on_sigbus(int sig, siginfo_t *info, void *context) {
        if (ps_jump != NULL) siglongjmp(*ps_jump, 1);
        if (ps_previous.sa_flags & SA_SIGINFO) {
            ps_previous.sa_sigaction(sig, info, context);
        } else if (ps_previous.sa_handler != SIG_DFL && ps_previous.sa_handler != SIG_IGN) {
            ps_previous.sa_handler(sig);
        } else {
            signal(sig, SIG_DFL);
            raise(sig);
        }
    }
    /* ours installed (again, when someone replaced it since: faulthandler does); -1: failed */
    static int ps_guard_sigbus(void) {
        struct sigaction now, ours;
        if (sigaction(SIGBUS, NULL, &now) != 0) return -1;
        if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == ps_on_sigbus) return 0;
        memset(&ours, 0, sizeof ours);
        ours.sa_sigaction = ps_on_sigbus;
        ours.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
        sigemptyset(&ours.sa_mask);
        return sigaction(SIGBUS, &ours, &ps_previous);
    }
    #if defined(__SSE2__)
    #include <emmintrin.h>
    #endif
    #include <stdint.h>
    /* memcpy with non-temporal stores: the destination's lines are written without being read
       first (a cached store reads each line before writing it: a third of the memory traffic of
       a large copy). Measured on this machine, 64 rows of 400 KB from a file's mapping at
       unaligned offsets: 19-20 GB/s against memcpy's 13-15 (16-17 from aligned ones). Only for
       batches far larger than a core's cache, which a copy could not leave cached anyway. */
    static void ps_stream(char *dst, const char *src, size_t n) {
    #if defined(__SSE2__)
        while (((uintptr_t)dst & 15) && n) { *dst++ = *src++; n--; }
        for (; n >= 64; n -= 64, src += 64, dst += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)src);
            __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
            _mm_stream_si128((__m128i *)dst, a);
            _mm_stream_si128((__m128i *)(dst + 16), b);
            _mm_stream_si128((__m128i *)(dst + 32), c);
            _mm_stream_si128((__m128i *)(dst + 48), d);
        }
    #endif
        memcpy(dst, src, n);
    }
    /* memcpy of n bytes each of k pieces (dst[j], src[j], n[j]); 0, or -1 on SIGBUS. Pieces of
       a page or more are copied by ps_stream when stream is set. The pages of the piece
       PS_AHEAD places on are prefetched first: a batch's samples lie at random places of the
       file, and a copy that starts on a page not yet in the TLB or cache stalls (measured:
       12 KB samples copied 40% faster so). A prefetch never faults. */
    #define PS_AHEAD 6
    static int ps_copy_guarded(char **dst, const char **src, const size_t *n, Py_ssize_t k,
                               int stream) {
        sigjmp_buf here;
        Py_ssize_t j;
        size_t o;
        if (sigsetjmp(here, 0)) { ps_jump = NULL; return -1; }
        ps_jump = &here;
        for (j = 0; j < k; j++) {
            if (j + PS_AHEAD < k && n[j + PS_AHEAD] >= 4096) {
                for (o = 0; o < n[j + PS_AHEAD]; o += 4096)
                    __builtin_prefetch(src[j + PS_AHEAD] + o, 0, 0);
            }
            if (stream && n[j] >= 4096) ps_stream(dst[j], src[j], n[j]);
            else memcpy(dst[j], src[j], n[j]);
        }
    #if defined(__SSE2__)
        if (stream) _mm_sfence();  /* the streamed stores visible before the batch is handed out */
    #endif
        ps_jump = NULL;
        return 0;
    }
    /* A batch's rows copied out of a file's mapping, guarded as ps_copy_guarded: for each j
       with src[j] (NULL: a sample read another way), row bytes from src[j] (a payload) to dst[j], streamed as there. The
       framing around each payload, the pre bytes before it and the after[j] after it:
       - head NULL, scratch NULL: not read (the checks off);
       - head given (a template with no masked ranges, its tail tlen bytes): compared in place
         with one memcmp each side (no copy); odd[j] = 0 where both match and after[j] is
         tlen, else odd[j] = 1 and the framing is copied as below, for the caller's full check
         (a FRAME header in the tail; a sample that differs: the check names it);
       - head NULL, scratch given: copied to scratch + j * stride (before) and
         + j * stride + tpl (after), odd[j] = 1, for the caller's check.
       0, or -1 on SIGBUS. */
    #define PS_AHEAD_ROWS 2
    static int ps_copy_rows(char **dst, const char **src, const size_t *after,
                            Py_ssize_t m, size_t row, size_t pre,
                            int stream, const unsigned char *head, const unsigned char *tail,
                            size_t tlen, unsigned char *scratch, size_t stride, size_t tpl,
                            unsigned char *odd) {
        sigjmp_buf here;
        Py_ssize_t j;
        size_t o;
        const char *s;
        if (sigsetjmp(here, 0)) { ps_jump = NULL; return -1; }
        ps_jump = &here;
        for (j = 0; j < m; j++) {
            s = src[j];
            if (s == NULL) continue;
            if (j + PS_AHEAD_ROWS < m && src[j + PS_AHEAD_ROWS] != NULL) {
                if (row >= 4096) {
                    for (o = 0; o < row; o += 4096)
                        __builtin_prefetch(src[j + PS_AHEAD_ROWS] + o, 0, 0);
                }
                if (head != NULL) {  /* the framing's lines: the compares below wait on them */
                    __builtin_prefetch(src[j + PS_AHEAD_ROWS] - pre, 0, 0);
                    __builtin_prefetch(src[j + PS_AHEAD_ROWS] + row, 0, 0);
                }
            }
            if (stream && row >= 4096) ps_stream(dst[j], s, row);
            else memcpy(dst[j], s, row);
            if (head != NULL && after[j] == tlen && memcmp(s - pre, head, pre) == 0
                    && memcmp(s + row, tail, tlen) == 0) {
                odd[j] = 0;
            } else if (scratch != NULL) {
                memcpy(scratch + j * stride, s - pre, pre);
                memcpy(scratch + j * stride + tpl, s + row, after[j]);
                odd[j] = 1;
            }
        }
    #if defined(__SSE2__)
        if (stream) _mm_sfence();
    #endif
        ps_jump = NULL;
        return 0;
    }
    """
    int ps_guard_sigbus() nogil
    int ps_copy_rows(
        char** dst, const char** src, const size_t* after, Py_ssize_t m, size_t row, size_t pre, int stream, const unsigned char* head,
        const unsigned char* tail, size_t tlen, unsigned char* scratch, size_t stride,
        size_t tpl, unsigned char* odd,
    ) nogil
    int ps_copy_guarded(
        char** dst, const char** src, const size_t* n, Py_ssize_t k, int stream
    ) nogil


cdef struct Workspace:
    # what SpanLoader._fill's reads of up to ``m`` items use, allocated once per call
    unsigned char* scratch  # m * (2 * TPL_MAX + 9): each item's framing
    char** dst  # 3 * m pieces of a copy out of a mapping
    const char** src
    size_t* n
    iovec* iov  # FILL_IOV pieces of one preadv
    unsigned char* gapbuf  # the bytes between coalesced spans
    unsigned char* odd  # m flags: a sample's framing copied to scratch for the full check
    int stream  # copies out of a mapping by non-temporal stores (ps_stream): a large batch


cdef int _workspace(Workspace* ws, Py_ssize_t m, Py_ssize_t gap) except -1:
    ws.scratch = <unsigned char*>malloc(<size_t>(m * (2 * TPL_MAX + 9) + 1))
    ws.dst = <char**>malloc(<size_t>(3 * m + 1) * sizeof(char*))
    ws.src = <const char**>malloc(<size_t>(3 * m + 1) * sizeof(char*))
    ws.n = <size_t*>malloc(<size_t>(3 * m + 1) * sizeof(size_t))
    ws.iov = <iovec*>malloc(FILL_IOV * sizeof(iovec))
    ws.gapbuf = <unsigned char*>malloc(<size_t>(gap + 1))
    ws.odd = <unsigned char*>malloc(<size_t>(m + 1))
    ws.stream = 0
    if (ws.scratch == NULL or ws.dst == NULL or ws.src == NULL or ws.n == NULL
            or ws.iov == NULL or ws.gapbuf == NULL or ws.odd == NULL):
        _release(ws)
        raise MemoryError()
    return 0


cdef void _release(Workspace* ws) noexcept:
    free(ws.scratch)
    free(ws.dst)
    free(ws.src)
    free(ws.n)
    free(ws.iov)
    free(ws.gapbuf)
    free(ws.odd)
    ws.scratch = ws.gapbuf = ws.odd = NULL
    ws.dst = NULL
    ws.src = NULL
    ws.n = NULL
    ws.iov = NULL


cdef void _copy_mapped(
    const unsigned char* base, unsigned char* buf, Workspace* ws, Py_ssize_t stride,
    Py_ssize_t pre, Py_ssize_t row, Py_ssize_t m, const int64_t[:] starts,
    const int64_t[:] ends, const int64_t[:] items, const int64_t[:] rowpos,
    unsigned char[:] slow, Framing fr, bint verify,
) noexcept nogil:
    """SpanLoader._fill's reads out of a mapping: every item not ``slow`` copied, guarded, its
    framing checked in place where ``fr`` is exact (``ws.odd[j]`` 0), else copied into the
    workspace's scratch (``ws.odd[j]`` 1) for :meth:`Framing.matches` (nothing of the framing
    read without ``verify``); on SIGBUS every item is marked ``slow`` (read again)."""
    cdef Py_ssize_t j, i
    cdef char** dst = ws.dst
    cdef const char** src = ws.src
    cdef size_t* after = ws.n
    cdef const unsigned char* head = fr.hp if verify and fr.exact else NULL
    for j in range(m):
        if slow[j]:
            src[j] = NULL
            continue
        i = items[j]
        dst[j] = <char*>(buf + rowpos[j] * row)
        src[j] = <const char*>(base + starts[i] + pre)
        after[j] = <size_t>(ends[i] - starts[i] - pre - row)
    if ps_copy_rows(
        dst, src, after, m, <size_t>row, <size_t>pre, ws.stream, head, fr.tp,
        <size_t>fr.tlen, ws.scratch if verify else NULL, <size_t>stride, TPL_MAX, ws.odd,
    ) != 0:
        for j in range(m):
            slow[j] = 1


cdef class SpanLoader:
    """Spans of samples read and loaded in one call each: ``SpanReader``'s paths for what most
    samples are, compiled, with the Python ones as their reference.

    :meth:`load` reads field ``f`` of sample ``i`` by span, as ``SpanReader._span`` does for a
    span that needs no memo capture, whose externals have a cached literal prologue in
    ``heads`` and which fits in one window. After :meth:`plan`, :meth:`load_sample` reads a
    whole sample whose fields are such a span (at most one), small ints (their decoded
    values) and arrays read from their payloads (``ArrayItem``). Both return :data:`SLOW` for
    anything else (and for a short read): the caller reads it its own way, which also fills
    ``heads``.

    ``ends``, ``bases``, ``ext_offsets``, ``ext_keys`` are the scan's int64 span arrays; a
    rewritten span is loaded by ``loads(data)``, or ``hooked(data)`` when it names a global and
    ``hooked`` is not None. ``stats`` (a ``ReaderStats``) counts the reads as the Python paths do.
    """

    cdef const int64_t[:, :] ends
    cdef const int64_t[:, :] bases
    cdef const int64_t[:] eoffs
    cdef const int64_t[:] ekeys
    cdef const int64_t[:, :] starts
    cdef const int64_t[:, :] ints
    cdef Py_ssize_t nf, n, p_bytes, p_items, p_fast  # p_*: counts not yet in stats
    cdef int protocol
    cdef bint planned, verify
    cdef object shift, loads, hooked, stats, empty, stale, name
    cdef public Py_ssize_t at  # load_samples: the position of the sample being read
    cdef dict heads, definers
    cdef list hows, intcols, items, frames
    cdef int64_t id_size, id_mtime, id_ctime, id_ino
    cdef bint bounded, b_recursive
    cdef int64_t b_limit, b_deepest
    cdef object b_check
    cdef array.array hows_c  # hows as C ints
    cdef bint no_definers
    # the externals of the span read last and their (head, key, list, local), reused while the
    # next span's are the same (a file's samples mostly refer to the same few shared values)
    cdef array.array last_keys
    cdef tuple last_hk

    def __init__(
        self, ends, bases, ext_offsets, ext_keys, dict heads, int protocol, shift, loads, hooked,
        stats,
    ):
        self.ends, self.bases, self.eoffs, self.ekeys = ends, bases, ext_offsets, ext_keys
        self.nf, self.n = self.ends.shape[1], self.ends.shape[0]
        self.heads, self.protocol, self.shift = heads, protocol, shift
        self.loads, self.hooked, self.stats = loads, hooked, stats
        self.planned = self.verify = self.bounded = False
        self.at, self.name = -1, None
        self.last_keys, self.last_hk = pyarray.array("q"), None

    def identify(self, int64_t size, int64_t mtime_ns, int64_t ctime_ns, int64_t ino, stale):
        """Check what the reads rely on: an array item's framing (read with its payload in one
        ``preadv``) and the file's identity (``fstat``: its size, and mtime, ctime and inode
        unless -1) after :meth:`load_sample` with ``check`` and after every
        :meth:`load_samples`; ``stale(what, offset, samples)`` builds the error for a changed
        file (``what`` None: its identity; ``offset`` -1: none)."""
        self.id_size, self.id_mtime, self.id_ctime, self.id_ino = size, mtime_ns, ctime_ns, ino
        self.stale, self.verify = stale, True

    cdef int _same_file(self, int fd, object labels, object label) except -1:
        """Raise the ``stale`` error, naming the samples ``labels`` (a list; None: ``label``
        alone), if the file open at ``fd`` is not the one indexed."""
        if self.verify and self._differs(fd):
            raise self.stale(None, -1, [label] if labels is None else [int(v) for v in labels])
        return 0

    cdef int _differs(self, int fd) except -1:
        """1 if the file open at ``fd`` is not the one indexed (``fstat``), else 0."""
        cdef struct_stat st
        cdef int r
        r = fstat(fd, &st)  # a fast syscall: not worth releasing the GIL
        if r != 0:
            PyErr_SetFromErrno(OSError)
            return -1
        if (
            st.st_size != self.id_size
            or (self.id_mtime >= 0
                and st.st_mtim.tv_sec * <int64_t>1000000000 + st.st_mtim.tv_nsec != self.id_mtime)
            or (self.id_ctime >= 0
                and st.st_ctim.tv_sec * <int64_t>1000000000 + st.st_ctim.tv_nsec != self.id_ctime)
            or (self.id_ino >= 0 and <uint64_t>st.st_ino != <uint64_t>self.id_ino)
        ):
            return 1
        return 0

    def bound(self, int64_t limit, int64_t deepest, bint recursive, check):
        """Hold every sample :meth:`load_sample` and :meth:`load_samples` return to the
        bounds of ``bounds.check_sample`` (arguments as for :func:`check_tree`), tested here in
        the same call; ``check(sample, label)`` (``check_sample`` of the reader) decides, and
        raises the error naming the sample, whenever that test does not pass outright."""
        self.b_limit, self.b_deepest, self.b_recursive = limit, deepest, recursive
        self.b_check, self.bounded = check, True

    cdef int _bounds(self, object v, object name) except -1:
        """Raise the bounds' error for sample ``v`` (labelled ``name``) if it passes them."""
        cdef bint ok
        if not self.bounded:
            return 0
        try:
            ok = _check_tree(v, self.b_limit, self.b_deepest, self.b_recursive) is None
        except Exception:  # errors.BoundExceeded (or what the walk met): the reference words it
            ok = False
        if not ok:
            self.b_check(v, name)
        return 0

    def plan(
        self, starts, list hows, ints, list intcols, list items, dict definers, empty,
    ):
        """Enable :meth:`load_sample`. Per field: ``hows[f]`` (0 span, 2 array item, 3 int),
        ``intcols[f]`` its column of ``ints`` (every int field's values, int64 ``(n, k)``),
        ``items[f]`` ``(shape, dtype, prefix, nbytes, swap, readonly, exceptions, head, tail,
        head_masked, tail_masked, bounds)`` (the last five: ``ArrayItem``'s framing, the masked
        ranges flat);
        ``definers`` the span starts that define shared values; ``empty`` is ``numpy.empty``."""
        if len(hows) != self.nf or any(h not in (H_SPAN, H_ITEM, H_INT) for h in hows):
            raise ValueError(f"no compiled plan for fields read as {hows}")
        frames = [None if it is None else Framing(*(<tuple>it)[7:12]) for it in items]
        for f in range(self.nf):
            if hows[f] == H_ITEM and (frames[f] is None or (<tuple>items[f])[2] != (<Framing>frames[f]).hlen):
                raise ValueError(f"field {f}: an array item's framing does not fit its prefix")
        self.starts, self.ints = starts, ints
        self.hows, self.intcols, self.items, self.frames = hows, intcols, items, frames
        self.hows_c = pyarray.array("i", hows)
        self.definers, self.empty = definers, empty
        self.no_definers = not definers
        self.planned = True

    cdef object _head(self, Py_ssize_t i, Py_ssize_t f, Py_ssize_t start):
        """The cached prologue of the externals of field ``f`` of sample ``i`` (its span at
        ``start``) and their keys, as ``(head, keys)``; None when the span is not one this
        loader reads (empty, over one window) or its prologue is not cached or not literal."""
        cdef Py_ssize_t n = self.ends[i, f] - start
        if n <= 0 or n > WINDOW:
            return None
        cdef Py_ssize_t k = i * self.nf + f, a = self.eoffs[k], m = self.eoffs[k + 1] - a, j
        if m < 0:
            return None
        cdef array.array last = self.last_keys
        cdef tuple hk = self.last_hk
        if hk is not None and len(last) == m:
            j = 0
            while j < m and last.data.as_longlongs[j] == self.ekeys[a + j]:
                j += 1
            if j == m:  # (SpanFields sets a key's prologue once and never replaces it)
                return hk
        cdef tuple key = PyTuple_New(m)
        cdef object v
        for j in range(m):
            v = PyLong_FromLongLong(self.ekeys[a + j])
            Py_INCREF(v)
            PyTuple_SET_ITEM(key, j, v)
        head = self.heads.get(key)
        if head is None:
            return None
        hk = (head, key, list(key), {kk: jj for jj, kk in enumerate(key)})
        array.resize(last, m)
        for j in range(m):
            last.data.as_longlongs[j] = self.ekeys[a + j]
        self.last_hk = hk
        return hk

    cdef void _count(self) except *:
        """Add the pending counts to ``stats`` (the Python path counts a read once it is done)."""
        if self.p_bytes:
            self.stats.bytes_read += self.p_bytes
        if self.p_items:
            self.stats.array_items += self.p_items
        if self.p_fast:
            self.stats.fast_reads += self.p_fast
        self.p_bytes = self.p_items = self.p_fast = 0

    cdef object _span(self, int fd, Py_ssize_t i, Py_ssize_t f, Py_ssize_t start, tuple hk):
        """Read and load one span; SLOW on a short read (nothing counted). Counts it as read
        once the bytes are in: a load that then fails was a read, as in the Python path."""
        cdef Py_ssize_t end = self.ends[i, f], n = end - start, got
        data = PyBytes_FromStringAndSize(NULL, n)
        cdef char* p = PyBytes_AS_STRING(data)
        with nogil:
            got = pread(fd, p, n, start)
        if got != n:
            self.p_bytes = self.p_items = self.p_fast = 0
            return SLOW
        self.p_bytes += n
        self.p_fast += 1
        self._count()
        out, buffers, finds = _rewrite(
            None, data, start, end, self.protocol, self.bases[i, f], self.shift, hk[2],
            None, 0, hk[0], hk[3],
        )
        if finds and self.hooked is not None:
            return self.hooked(out)
        return self.loads(out)

    cdef object _array(self, int fd, tuple spec, Framing fr, Py_ssize_t start, Py_ssize_t end):
        """A fresh array of ``spec`` filled from its payload (counted as pending), read in one
        ``preadv`` with the bytes around it, which must match its framing ``fr`` (else the
        ``stale`` error); SLOW when the file ends first (or the array is too big for one
        ``preadv``: the caller's path reads it in parts)."""
        cdef Py_ssize_t pre = fr.hlen, nbytes = spec[3], after = end - start - pre - nbytes
        cdef Py_ssize_t got, total
        cdef unsigned char hb[TPL_MAX]
        cdef unsigned char tb[TPL_MAX + 9]
        cdef iovec iov[3]
        cdef Py_buffer view
        cdef bint verify = self.verify
        if nbytes < 0 or after < 0 or after > fr.tlen + 9:
            raise self.stale("its span does not fit the array's framing", start, [self.name])
        out = self.empty(spec[0], spec[1])
        PyObject_GetBuffer(out, &view, PyBUF_WRITABLE)
        try:
            if view.len != nbytes:
                raise ValueError(f"an array of {view.len} bytes for a {nbytes}-byte payload")
            iov[0].iov_base, iov[0].iov_len = hb, <size_t>pre
            iov[1].iov_base, iov[1].iov_len = view.buf, <size_t>nbytes
            iov[2].iov_base, iov[2].iov_len = tb, <size_t>after
            total = pre + nbytes + after
            with nogil:
                if verify:
                    got = preadv(fd, iov, 3, start)
                else:  # what reads did before the checks (the benchmark's baseline)
                    total = nbytes
                    got = pread(fd, view.buf, nbytes, start + pre) if nbytes else 0
        finally:
            PyBuffer_Release(&view)
        if got != total:
            return SLOW
        if verify and not fr.matches(hb, tb, after):
            raise self.stale(
                "the bytes around its array's payload (opcodes, dtype, shape, length) are not "
                "those indexed",
                start,
                [self.name],
            )
        self.p_bytes += nbytes
        self.p_items += 1
        if spec[4]:
            out.byteswap(inplace=True)
        if spec[5]:
            out.flags.writeable = False
        return out

    def load(self, int fd, Py_ssize_t i, Py_ssize_t f, Py_ssize_t start):
        """Field ``f`` of sample ``i``, its span starting at ``start``; or :data:`SLOW`."""
        hk = self._head(i, f, start)
        if hk is None:
            return SLOW
        self.p_bytes = self.p_items = self.p_fast = 0
        return self._span(fd, i, f, start, hk)

    def fill_rows(
        self, int fd, rows, Framing fr, list order, list starts, list ends, list labels
    ):
        """Fill row ``k`` of ``rows`` (a C-contiguous ``(n, ...)`` array, ``n`` as long as
        ``starts``) with the payload of the array item whose span is ``[starts[k], ends[k])``,
        for each ``k`` of ``order``, each in one ``preadv`` with the bytes around it, which must
        match ``fr`` (else the ``stale`` error naming ``labels[k]``). Returns ``len(order)``, or
        the position in ``order`` of a short read (the caller reads from there its own way)."""
        cdef Py_buffer view
        cdef Py_ssize_t n = len(starts), m = len(order), j, k, start, after, got, total
        cdef Py_ssize_t pre = fr.hlen, row
        cdef unsigned char hb[TPL_MAX]
        cdef unsigned char tb[TPL_MAX + 9]
        cdef iovec iov[3]
        if not self.verify:
            raise ValueError("fill_rows checks what it reads: call identify first")
        if len(ends) != n or len(labels) != n:
            raise ValueError(f"{n} starts, {len(ends)} ends, {len(labels)} labels")
        PyObject_GetBuffer(rows, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
        try:
            if n == 0 or view.len % n:
                raise ValueError(f"{view.len} bytes of rows for {n} samples")
            row = view.len // n
            iov[0].iov_base, iov[0].iov_len = hb, <size_t>pre
            iov[1].iov_len = <size_t>row
            iov[2].iov_base = tb
            for j in range(m):
                k = order[j]
                if not 0 <= k < n:
                    raise IndexError(f"row {k} of {n}")
                start = starts[k]
                after = <Py_ssize_t>ends[k] - start - pre - row
                if after < 0 or after > fr.tlen + 9:
                    raise self.stale("its span does not fit the array's framing", start, [labels[k]])
                iov[1].iov_base = <char*>view.buf + k * row
                iov[2].iov_len = <size_t>after
                total = pre + row + after
                with nogil:
                    got = preadv(fd, iov, 3, start)
                if got != total:
                    return j
                if not fr.matches(hb, tb, after):
                    raise self.stale(
                        "the bytes around its array's payload (opcodes, dtype, shape, length) "
                        "are not those indexed",
                        start,
                        [labels[k]],
                    )
        finally:
            PyBuffer_Release(&view)
        return m

    cdef Py_ssize_t _fill(
        self, int fd, unsigned char* buf, Py_ssize_t row, Py_ssize_t nrows, Framing fr,
        const int64_t[:] starts, const int64_t[:] ends, const unsigned char[:] direct,
        const int64_t[:] items, const int64_t[:] rowpos, const int64_t[:] labels,
        unsigned char[:] slow, Py_ssize_t gap, const unsigned char[:] mapped, Workspace* ws,
    ) except -1:
        """Fill row ``rowpos[j]`` of the ``nrows`` rows of ``row`` bytes at ``buf`` (a batch
        buffer) with the payload of array item ``items[j]`` (its span ``[starts[i], ends[i])`` of the field's
        columns), for every ``j``, the bytes around each payload checked against ``fr`` (else
        the ``stale`` error naming ``labels[j]``) once every read is done. The batch plan:
        ``items`` come in offset order, and spans whose gap to the next is at most ``gap`` bytes
        are read by one ``preadv`` (the gap into scratch); every read runs with the GIL
        released. An item whose ``direct`` flag is 0 (``direct`` empty: every item's is 1) is
        not read from its payload: it is marked in ``slow``, with every item after a read that
        came short (the file ends first); the caller reads those its own way, which names the
        error. Returns the number of items filled.

        ``mapped``, the file mapped whole (``mmap``), is read by ``memcpy`` instead of
        ``preadv`` (a page-cache copy without a system call per sample, as a memmap's fancy
        index is): guarded, so a file cut short under the mapping marks the items ``slow``
        instead of raising SIGBUS. There each framing is compared in place (``ps_copy_rows``:
        no copy of it, its lines prefetched with the payload's), and copied to scratch for
        :meth:`Framing.matches` only where that compare cannot decide (masked ranges, a FRAME
        header in the tail) or fails (the full check names the sample). With the checks off
        the framing is not read at all (the cost benchmark's baseline).

        The caller gives a workspace for at least ``len(items)`` items and ``gap``, and has
        guarded SIGBUS (``ps_guard_sigbus``) when ``mapped``."""
        cdef Py_ssize_t m = items.shape[0], j, g, nv, total, got, d, after, i
        cdef Py_ssize_t pre = fr.hlen, short_at = -1, stride = 2 * TPL_MAX + 9
        cdef Py_ssize_t n = starts.shape[0], filled = 0
        cdef unsigned char* scratch = ws.scratch
        cdef unsigned char* gapbuf = ws.gapbuf
        cdef iovec* iov = ws.iov
        cdef bint verify = self.verify, inplace = False
        if rowpos.shape[0] != m or labels.shape[0] != m or ends.shape[0] != n:
            raise ValueError(
                f"{m} items, {rowpos.shape[0]} rows, {labels.shape[0]} labels; "
                f"{n} starts, {ends.shape[0]} ends"
            )
        if gap < 0 or gap > FILL_GAP_MAX:
            raise ValueError(f"gap must be within [0, {FILL_GAP_MAX}], got {gap}")
        if m == 0:
            return 0
        try:
            if slow.shape[0] != m or (direct.shape[0] and direct.shape[0] != n):
                raise ValueError(f"{slow.shape[0]} slow flags, {direct.shape[0]} direct, {n} spans")
            for j in range(m):  # everything checked before the first read
                i = items[j]
                if not 0 <= i < n:
                    raise IndexError(f"item {i} of {n}")
                if direct.shape[0] and not direct[i]:
                    slow[j] = 1
                    continue
                if not 0 <= rowpos[j] < nrows:
                    raise IndexError(f"row {rowpos[j]} of {nrows}")
                after = ends[i] - starts[i] - pre - row
                if after < 0 or after > fr.tlen + 9:
                    raise self.stale(
                        "its span does not fit the array's framing", starts[i], [labels[j]]
                    )
            if mapped is not None and mapped.shape[0]:
                for j in range(m):
                    if not slow[j] and ends[items[j]] > mapped.shape[0]:
                        break  # grown since it was mapped: preadv reads it all
                else:
                    with nogil:
                        _copy_mapped(
                            &mapped[0], buf, ws, stride, pre, row, m, starts, ends, items,
                            rowpos, slow, fr, verify,
                        )
                    mapped = None  # done: the preadv loop below is skipped
                    short_at = m
                    inplace = True
            with nogil:
                j = m if short_at == m else 0
                while j < m:
                    if slow[j]:
                        j += 1
                        continue
                    nv = total = 0
                    g = j
                    while True:
                        i = items[g]
                        after = ends[i] - starts[i] - pre - row
                        iov[nv].iov_base, iov[nv].iov_len = scratch + g * stride, <size_t>pre
                        iov[nv + 1].iov_base = buf + rowpos[g] * row
                        iov[nv + 1].iov_len = <size_t>row
                        iov[nv + 2].iov_base = scratch + g * stride + TPL_MAX
                        iov[nv + 2].iov_len = <size_t>after
                        nv += 3
                        total += ends[i] - starts[i]
                        if g + 1 >= m or slow[g + 1] or nv + 4 > FILL_IOV or total > FILL_READ_MAX:
                            break
                        d = starts[items[g + 1]] - ends[i]
                        if d < 0 or d > gap:
                            break
                        if d:
                            iov[nv].iov_base, iov[nv].iov_len = gapbuf, <size_t>d
                            nv += 1
                            total += d
                        g += 1
                    got = preadv(fd, iov, <int>nv, starts[items[j]])
                    if got != total:
                        short_at = j
                        break
                    j = g + 1
                if short_at >= 0:
                    for j in range(short_at, m):
                        slow[j] = 1
            g = m if short_at < 0 else short_at
            if g == m:
                short_at = -1
            if verify:
                for j in range(g):
                    if slow[j] or (inplace and not ws.odd[j]):  # checked in place already
                        continue
                    i = items[j]
                    after = ends[i] - starts[i] - pre - row
                    if not fr.matches(scratch + j * stride, scratch + j * stride + TPL_MAX, after):
                        raise self.stale(
                            "the bytes around its array's payload (opcodes, dtype, shape, "
                            "length) are not those indexed",
                            starts[i],
                            [labels[j]],
                        )
            for j in range(m):
                filled += not slow[j]
        finally:
            pass
        return filled

    def load_sample(self, int fd, Py_ssize_t i, bint check=False, name=None):
        """Sample ``i`` as a tuple (after :meth:`plan`); or :data:`SLOW` with nothing counted
        (before any read, or after a short read: the file changed, the caller's path names
        the error). Fields are read in the Python path's order: arrays, then the span. With
        ``check`` the file's identity is checked after the reads; errors name sample ``name``
        (default ``i``)."""
        self.name = i if name is None else name
        v = self._sample(fd, i)
        if v is not SLOW:
            if check:
                self._same_file(fd, None, self.name)
            self._bounds(v, self.name)
        return v

    def load_samples(self, int fd, list items, list labels, fallback):
        """:meth:`load_sample` of each of ``items`` (in that order), in a list, with
        ``fallback(item, label)`` reading the samples it cannot (the caller's path, in turn);
        errors raised here name ``labels[k]``; on an exception :attr:`at` is the position of
        the sample that raised it (the caller names a refusal raised by ``hooked`` with its
        label: the label is never stored on the lookup)."""
        cdef Py_ssize_t k, m = len(items)
        if len(labels) != m:
            raise ValueError(f"{m} samples but {len(labels)} labels")
        out = [None] * m
        for k in range(m):
            self.at = k
            self.name = labels[k]
            v = self._sample(fd, items[k])
            if v is SLOW:
                v = fallback(items[k], labels[k])
            out[k] = v
        self._same_file(fd, labels, None)  # after the reads: a write that raced them shows by now
        if self.bounded:
            for k in range(m):
                self.at = k
                self._bounds(out[k], labels[k])
        return out

    cdef object _sample(self, int fd, Py_ssize_t i):
        if not self.planned or not 0 <= i < self.n:
            return SLOW
        cdef Py_ssize_t f, span = -1, s
        cdef int how
        cdef object hk = None, v
        cdef const int* hows = self.hows_c.data.as_ints
        cdef bint no_definers = self.no_definers
        for f in range(self.nf):  # decide first: SLOW must come before any read
            how = hows[f]
            if how == H_SPAN:
                s = self.starts[i, f]
                if span >= 0 or (not no_definers and s in self.definers):
                    return SLOW
                hk = self._head(i, f, s)
                if hk is None:
                    return SLOW
                span = f
            elif how == H_ITEM:
                exceptions = (<tuple>self.items[f])[6]
                if (exceptions and i in exceptions) or (
                    not no_definers and self.starts[i, f] in self.definers
                ):
                    return SLOW
        self.p_bytes = self.p_items = self.p_fast = 0
        out = PyTuple_New(self.nf)
        for f in range(self.nf):
            how = hows[f]
            if how == H_SPAN:
                continue
            if how == H_INT:
                v = PyLong_FromLongLong(self.ints[i, <Py_ssize_t>self.intcols[f]])
            else:
                v = self._array(
                    fd, <tuple>self.items[f], <Framing>self.frames[f], self.starts[i, f],
                    self.ends[i, f],
                )
                if v is SLOW:
                    self.p_bytes = self.p_items = self.p_fast = 0
                    return SLOW
            Py_INCREF(v)
            PyTuple_SET_ITEM(out, f, v)
        if span >= 0:
            v = self._span(fd, i, span, self.starts[i, span], hk)  # counts the arrays first
            if v is SLOW:
                return SLOW
            Py_INCREF(v)
            PyTuple_SET_ITEM(out, span, v)
        else:
            self._count()
        return out


cdef class FileBatch:
    """What a batch read needs of one span-read file, built once per file and process
    (``read.filefill.FileFill``): its descriptor, compiled ``loader`` and mapping (``mapped``,
    an ``mmap`` or None); per array field ``k``: its field ``c = afield[k]`` (the batch column
    it fills, and its spans ``starts[:, c]``, ``ends[:, c]``: the scan's own span arrays, never
    copied), its ``Framing`` (``frames[k]``) and which samples are read from their payloads
    (``direct[:, k]``; an empty array: all); per int field ``k``: its column (``ifield[k]``) and
    values (``ivalues[:, k]``).

    For :func:`fill_spans`, the caller sets :attr:`tag` (which column plan the file's fields
    fit), :attr:`plain` (its rows need nothing after the copy: native byte order, bounds held),
    :attr:`stats` (the reader's ``ReaderStats``) and :attr:`row_bytes` (a sample's array bytes);
    :meth:`close` retires the record (its file is closing): no batch reads it afterwards."""

    cdef int fd
    cdef SpanLoader loader
    cdef object mapping
    cdef const unsigned char[:] mapped
    cdef list frames
    cdef const int64_t[:] afield, ifield
    cdef const int64_t[:, :] starts, ends, ivalues
    cdef const unsigned char[:, :] direct
    cdef bint closed
    cdef Py_ssize_t busy  # batch reads under way (another thread's): the mapping stays till they end
    cdef public int tag
    cdef public bint plain
    cdef public object stats
    cdef public Py_ssize_t row_bytes

    def __init__(
        self, int fd, SpanLoader loader, mapped, afield, list frames, starts, ends, direct,
        ifield, ivalues,
    ):
        self.fd, self.loader, self.mapping, self.frames = fd, loader, mapped, frames
        self.mapped = mapped if mapped is not None else b""
        self.afield, self.starts, self.ends, self.direct = afield, starts, ends, direct
        self.ifield, self.ivalues = ifield, ivalues
        self.closed, self.tag, self.plain, self.stats, self.row_bytes = False, -1, False, None, 0
        self.busy = 0
        if not (
            len(frames) == self.afield.shape[0]
            and self.starts.shape[0] == self.ends.shape[0]
            and self.starts.shape[1] == self.ends.shape[1]
            and all(0 <= f < self.starts.shape[1] for f in afield)
            and self.ivalues.shape[1] == self.ifield.shape[0]
            and (self.direct.shape[0] == 0 or self.direct.shape[1] == self.afield.shape[0])
        ):
            raise ValueError("a FileBatch's per-field arrays do not agree")

    def close(self):
        """Retire the record: :func:`fill_spans` refuses it from now on, and its view of the
        mapping is let go (the mapping can close) now, or when the reads under way end."""
        self.closed = True
        if self.busy == 0:
            self._let_go()

    cdef void _let_go(self) noexcept:
        self.mapped = b""
        self.mapping = None

    cdef void _hold(self) noexcept:
        self.busy += 1

    cdef void _done(self) noexcept:
        self.busy -= 1
        if self.closed and self.busy == 0:
            self._let_go()


cdef Py_ssize_t _fill_file(
    FileBatch fb, Py_buffer* views, char* held, Py_ssize_t nf, Py_ssize_t nrows,
    const int64_t[:] items, const int64_t[:] rows, const int64_t[:] labels,
    unsigned char[:] slow, Py_ssize_t gap, Workspace* ws,
) except -1:
    """One file's part of a batch (its ``items`` into ``rows``): its ints, then its arrays by
    :meth:`SpanLoader._fill`, then its identity. Returns the count the last array field filled."""
    cdef Py_ssize_t k, c, j, count = 0, m = items.shape[0]
    cdef int64_t* out
    cdef const unsigned char[:] nodirect = b""
    cdef const unsigned char[:] direct
    for k in range(fb.ifield.shape[0]):
        c = fb.ifield[k]
        if not (0 <= c < nf and held[c] and views[c].len == nrows * 8):
            raise ValueError(f"field {c} is no int64 column of {nrows} rows")
        out = <int64_t*>views[c].buf
        for j in range(m):
            if not (0 <= items[j] < fb.ivalues.shape[0] and 0 <= rows[j] < nrows):
                raise IndexError(f"item {items[j]} into row {rows[j]}")
            out[rows[j]] = fb.ivalues[items[j], k]
    for k in range(fb.afield.shape[0]):
        c = fb.afield[k]
        if not (0 <= c < nf and held[c] and views[c].len % nrows == 0):
            raise ValueError(f"field {c} is no array column of {nrows} rows")
        direct = fb.direct[:, k] if fb.direct.shape[0] else nodirect
        count = fb.loader._fill(
            fb.fd, <unsigned char*>views[c].buf, views[c].len // nrows, nrows,
            <Framing>fb.frames[k], fb.starts[:, c], fb.ends[:, c], direct,
            items, rows, labels, slow, gap, fb.mapped, ws,
        )
    if fb.loader.verify and fb.loader._differs(fb.fd):
        raise fb.loader.stale(None, -1, [int(v) for v in labels])
    return count


cdef int _hold_columns(list columns, Py_buffer* views, char* held) except -1:
    """Every column that is not None held as a writable C-contiguous buffer."""
    cdef Py_ssize_t c
    for c in range(len(columns)):
        if columns[c] is not None:
            PyObject_GetBuffer(columns[c], &views[c], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
            held[c] = 1
    return 0


cdef void _let_go(Py_buffer* views, char* held, Py_ssize_t nf) noexcept:
    cdef Py_ssize_t c
    if views != NULL and held != NULL:
        for c in range(nf):
            if held[c]:
                PyBuffer_Release(&views[c])
    free(views)
    free(held)


def fill_batch(
    list files, const int64_t[:] cuts, const int64_t[:] items, const int64_t[:] rows,
    const int64_t[:] labels, list columns, unsigned char[:] slow, Py_ssize_t gap,
    bint stream=False,
):
    """A batch read in one call: ``files[g]`` (a :class:`FileBatch`) fills positions
    ``cuts[g]:cuts[g + 1]`` of ``items`` (its samples, in offset order), ``rows`` (their rows in
    the batch) and ``labels`` (the names errors give them) into ``columns`` (one per field: a
    C-contiguous ``(B, ...)`` array for an array field, int64 ``(B,)`` for an int field, None
    for others), by :meth:`SpanLoader._fill`'s reads (copies out of a mapping by non-temporal
    stores with ``stream``); each file's identity is checked after its reads. ``slow`` marks
    what the caller reads its own way. Returns each file's count of samples filled (int64)."""
    cdef Py_ssize_t nf = len(columns), ng = len(files), g, a, b
    cdef Py_buffer* views = <Py_buffer*>calloc(nf + 1, sizeof(Py_buffer))
    cdef char* held = <char*>calloc(nf + 1, 1)
    cdef Workspace ws
    if views == NULL or held == NULL:
        _let_go(views, held, 0)
        raise MemoryError()
    if gap < 0 or gap > FILL_GAP_MAX:
        _let_go(views, held, 0)
        raise ValueError(f"gap must be within [0, {FILL_GAP_MAX}], got {gap}")
    if ps_guard_sigbus() != 0:
        _let_go(views, held, 0)
        PyErr_SetFromErrno(OSError)
    _workspace(&ws, items.shape[0], gap)
    ws.stream = stream
    filled = np.zeros(ng, np.int64)
    cdef int64_t[:] counts = filled
    held_files = [<FileBatch?>f for f in files]
    for f in held_files:
        (<FileBatch>f)._hold()
    try:
        if cuts.shape[0] != ng + 1 or items.shape[0] != rows.shape[0] or items.shape[0] != labels.shape[0] or slow.shape[0] != items.shape[0]:
            raise ValueError(f"{ng} files, {cuts.shape[0]} cuts, {items.shape[0]} items")
        _hold_columns(columns, views, held)
        for g in range(ng):
            a, b = cuts[g], cuts[g + 1]
            if not 0 <= a <= b <= items.shape[0]:
                raise IndexError(f"cut {a}:{b} of {items.shape[0]}")
            counts[g] = _fill_file(
                <FileBatch?>files[g], views, held, nf, items.shape[0], items[a:b], rows[a:b],
                labels[a:b], slow[a:b], gap, &ws,
            )
    finally:
        for f in held_files:
            (<FileBatch>f)._done()
        _let_go(views, held, nf)
        _release(&ws)
    return filled


# -- a whole batch planned and read in one call --------------------------------------------------

from libc.stdlib cimport qsort
from posix.fcntl cimport POSIX_FADV_WILLNEED, posix_fadvise
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact

cdef struct _Pick:  # one sample of a batch: its global index and its row
    int64_t index
    int64_t row


cdef int _pick_order(const void* a, const void* b) noexcept nogil:
    """By index, then row: the order of a stable sort of the indices."""
    cdef const _Pick* x = <const _Pick*>a
    cdef const _Pick* y = <const _Pick*>b
    if x.index != y.index:
        return -1 if x.index < y.index else 1
    return -1 if x.row < y.row else (1 if x.row > y.row else 0)


cdef int64_t _now_ns() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return <int64_t>t.tv_sec * 1000000000 + t.tv_nsec


cdef Py_ssize_t _picks(object indices, int64_t total, _Pick* picks, Py_ssize_t m) except -2:
    """``indices`` (a list of ints, or int64 values) into ``picks`` with their rows, negative
    ones counted from the end; -1 when one is not an int or out of range (the caller's path
    raises the error), else 0."""
    cdef Py_ssize_t j
    cdef int overflow = 0
    cdef long long v
    cdef const int64_t[:] values
    cdef object item
    if type(indices) is list:
        for j in range(m):
            item = <object>PyList_GET_ITEM(indices, j)
            if not PyLong_CheckExact(item):
                return -1
            v = PyLong_AsLongLongAndOverflow(item, &overflow)
            if overflow:
                return -1
            picks[j].index, picks[j].row = v, j
    else:
        values = indices
        for j in range(m):
            picks[j].index, picks[j].row = values[j], j
    for j in range(m):
        if picks[j].index < 0:
            picks[j].index += total
        if not 0 <= picks[j].index < total:
            return -1
    return 0


def fill_spans(
    list records, const int64_t[:] firsts, int64_t total, object indices, list columns,
    Py_ssize_t gap, int tag, bint stream, int64_t[:] state,
):
    """A batch planned and read in one call (``read.batchread.BatchReader``'s common case):
    samples ``indices`` (a list of ints or an int64 array; negative ones count from the end of
    ``total``) sorted once (samples are numbered file after file, in offset order: the sort
    groups them by file, ``firsts[pos]`` being file ``pos``'s first), each file's part read by
    :func:`fill_batch`'s reads from ``records[pos]`` (a :class:`FileBatch`) into ``columns``,
    row ``k`` for ``indices[k]``.

    Returns False, before any read, when the batch is not this call's to read: an index not an
    int or out of range, a file of the batch with no open record tagged ``tag`` (the caller
    plans it itself). Returns None when every sample was read in full from a ``plain`` record:
    the reads are counted in the records' ``stats``. Else ``(files, cuts, work, slow, counts,
    finish)``: file ``files[g]``'s samples are ``work[0, cuts[g]:cuts[g + 1]]`` (in rows
    ``work[1]``, named ``work[2]``), ``counts[g]`` of them filled, ``slow`` those left, and the
    caller finishes (and counts) each file with ``finish[g]`` set.

    ``state`` is ``[advise, took_ns, nbytes, ns_per_sample, bytes_per_us]``: with ``advise``
    every span is asked of the kernel first (``POSIX_FADV_WILLNEED``: a cold disk sees a
    queue); after the reads ``took_ns`` and ``nbytes`` are what they took, and ``advise`` is
    set again when they took longer than ``ns_per_sample`` each plus ``nbytes`` at
    ``bytes_per_us`` (they came from the device, not the page cache)."""
    cdef Py_ssize_t m = len(indices), nfiles = firsts.shape[0], nf = len(columns)
    cdef Py_ssize_t j, g, ng = 0, pos, lo, hi, mid, a, b, i, k, c
    cdef _Pick* picks
    cdef Py_ssize_t* fpos
    cdef Py_ssize_t* fcut
    cdef Py_buffer* views = NULL
    cdef char* held = NULL
    cdef FileBatch fb
    cdef object rec
    cdef Workspace ws
    cdef int64_t t0, took, nbytes = 0
    cdef bint finishing = False
    cdef Py_ssize_t nheld = 0
    cdef list mine = []  # the batch's files' records, group by group
    cdef int64_t[:, ::1] work
    cdef unsigned char[::1] slow, finish
    cdef int64_t[::1] counts
    if m == 0 or len(records) != nfiles or state.shape[0] < 5:
        return False
    picks = <_Pick*>malloc(<size_t>m * sizeof(_Pick))
    fpos = <Py_ssize_t*>malloc(<size_t>(m + 1) * sizeof(Py_ssize_t))
    fcut = <Py_ssize_t*>malloc(<size_t>(m + 1) * sizeof(Py_ssize_t))
    if picks == NULL or fpos == NULL or fcut == NULL:
        free(picks)
        free(fpos)
        free(fcut)
        raise MemoryError()
    ws.scratch = NULL
    ws.dst = NULL
    ws.src = NULL
    ws.n = NULL
    ws.iov = NULL
    ws.gapbuf = NULL
    ws.odd = NULL
    try:
        if _picks(indices, total, picks, m) < 0:
            return False
        qsort(picks, <size_t>m, sizeof(_Pick), _pick_order)
        # each sample's file (the last whose first sample is at or before it), one group per file
        pos = 0
        for j in range(m):
            if j == 0 or pos + 1 < nfiles and picks[j].index >= firsts[pos + 1]:
                lo, hi = pos, nfiles  # firsts[lo] <= index < firsts[hi] (hi == nfiles: past all)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if firsts[mid] <= picks[j].index:
                        lo = mid
                    else:
                        hi = mid
                if j and lo == pos:
                    continue
                pos = lo
                rec = <object>PyList_GET_ITEM(records, pos)
                if type(rec) is not FileBatch:
                    return False
                fb = <FileBatch>rec
                if fb.closed or fb.tag != tag:
                    return False
                fpos[ng], fcut[ng] = pos, j
                mine.append(fb)  # held here: another thread may replace records[pos] meanwhile
                ng += 1
        fcut[ng] = m
        for g in range(ng):  # every file's mapping kept until its reads are done
            (<FileBatch>mine[g])._hold()
        nheld = ng
        work_arr = np.empty((3, m), np.int64)
        slow_arr = np.zeros(m, np.uint8)
        counts_arr = np.zeros(ng, np.int64)
        work, slow, counts = work_arr, slow_arr, counts_arr
        for g in range(ng):
            for j in range(fcut[g], fcut[g + 1]):
                work[0, j] = picks[j].index - firsts[fpos[g]]
                work[1, j] = picks[j].row
                work[2, j] = picks[j].index
        if gap < 0 or gap > FILL_GAP_MAX:
            raise ValueError(f"gap must be within [0, {FILL_GAP_MAX}], got {gap}")
        if ps_guard_sigbus() != 0:
            PyErr_SetFromErrno(OSError)
        views = <Py_buffer*>calloc(nf + 1, sizeof(Py_buffer))
        held = <char*>calloc(nf + 1, 1)
        if views == NULL or held == NULL:
            raise MemoryError()
        _hold_columns(columns, views, held)
        _workspace(&ws, m, gap)
        ws.stream = stream
        if state[0]:  # every span asked for at once: the device sees a queue
            for g in range(ng):
                fb = <FileBatch>mine[g]
                with nogil:
                    for k in range(fb.afield.shape[0]):
                        c = fb.afield[k]
                        for j in range(fcut[g], fcut[g + 1]):
                            i = work[0, j]
                            posix_fadvise(
                                fb.fd, fb.starts[i, c], fb.ends[i, c] - fb.starts[i, c],
                                POSIX_FADV_WILLNEED,
                            )
        t0 = _now_ns()
        for g in range(ng):
            fb = <FileBatch>mine[g]
            a, b = fcut[g], fcut[g + 1]
            counts[g] = _fill_file(
                fb, views, held, nf, m, work[0, a:b], work[1, a:b], work[2, a:b], slow[a:b],
                gap, &ws,
            )
            nbytes += counts[g] * fb.row_bytes
        took = _now_ns() - t0
        state[1], state[2] = took, nbytes
        state[0] = took > state[3] * m + (nbytes * 1000) // max(state[4], 1)
        finish_arr = np.zeros(ng, np.uint8)
        finish = finish_arr
        for g in range(ng):
            fb = <FileBatch>mine[g]
            if fb.plain and counts[g] == fcut[g + 1] - fcut[g]:  # the common case
                stats = fb.stats
                stats.array_items += counts[g] * fb.afield.shape[0]
                stats.bytes_read += counts[g] * fb.row_bytes
            else:
                finish[g] = 1
                finishing = True
        if not finishing:
            return None
        files_arr = np.empty(ng, np.int64)
        cuts_arr = np.empty(ng + 1, np.int64)
        for g in range(ng):
            files_arr[g] = fpos[g]
            cuts_arr[g] = fcut[g]
        cuts_arr[ng] = m
        return files_arr, cuts_arr, work_arr, slow_arr, counts_arr, finish_arr
    finally:
        for g in range(nheld):
            (<FileBatch>mine[g])._done()
        free(picks)
        free(fpos)
        free(fcut)
        _let_go(views, held, nf)
        _release(&ws)


# -- the ArrayItem check's byte gather: the compiled twin of pickleshard.scan.fastpath.gathered --

import numpy as np


def gather(object buf, const int64_t[:] at, const int64_t[:] rel, object release):
    """:func:`pickleshard.scan.fastpath.gathered`, compiled: ``buf[at[k] + rel]`` for every ``k`` as a
    ``(len(at), len(rel))`` uint8 array, read in offset order; ``release`` (None, or the
    ``picklekit.walk.releaser`` of ``buf``) is called as the reference calls it, once per 4 MiB block
    of offsets passed."""
    cdef Py_ssize_t n = at.shape[0], r = rel.shape[0], k, j, i, prev
    out = np.empty((n, r), np.uint8)
    if not n:
        return out
    cdef unsigned char[:, ::1] o = out
    cdef const unsigned char[:] b = buf
    cdef const int64_t[:] od = np.argsort(np.asarray(at), kind="stable")
    cdef int64_t top = 0
    for j in range(r):
        top = rel[j] if j == 0 or rel[j] > top else top
    for k in range(n):
        i = od[k]
        if release is not None and k and at[i] >> RELEASE_SHIFT != at[od[k - 1]] >> RELEASE_SHIFT:
            release(at[od[k - 1]] + top + 1)
        for j in range(r):
            o[i, j] = b[at[i] + rel[j]]
    if release is not None:
        release(at[od[n - 1]] + top + 1)
    return out



@cython.boundscheck(False)
@cython.wraparound(False)
def template_matches(
    object buf,
    const int64_t[:] st,
    const int64_t[:] lengths,
    const int64_t[:] cand,
    int64_t length,
    const int64_t[:] rel,
    const unsigned char[:] template,
    const unsigned char[:] mask,
    const int64_t[:] ats,
    object release,
):
    """:func:`pickleshard.scan.fastpath.template_matches_py`, compiled: for each sample
    ``cand[k]`` (ascending) whether its span has the template's bytes (``buf[st + rel[j]] ==
    template[j]`` wherever ``mask[j]``): a span ``length`` long as it is, any other (``length +
    9``) with a FRAME header at one of the offsets ``ats`` and the bytes from there on 9 later.
    One pass over the samples in offset order, no temporaries; ``release`` (None, or the
    ``picklekit.walk.releaser`` of ``buf``) is called once per 4 MiB block of offsets passed,
    as :func:`gather` calls it. A bool array, one per candidate."""
    cdef Py_ssize_t n = cand.shape[0], r = rel.shape[0], nb = ats.shape[0], k, j, b
    if template.shape[0] != r or mask.shape[0] != r:
        raise ValueError(f"a template of {template.shape[0]} bytes for {r} offsets")
    out = np.zeros(n, np.bool_)
    if not n:
        return out
    cdef unsigned char[::1] o = out.view(np.uint8)
    cdef const unsigned char[:] bv = buf
    cdef int64_t i, s, at, off, top = 0, low = 0, framed_top, reach, prev = -1
    cdef int64_t size = bv.shape[0]
    cdef bint same
    # Bounds are checked here, once per sample, not at every byte (the loops below run
    # unchecked): a plain span's check reads [s + low, s + top), a framed one's up to
    # s + framed_top, for a sample starting at s.
    for j in range(r):
        top = rel[j] if j == 0 or rel[j] > top else top
        low = rel[j] if j == 0 or rel[j] < low else low
    framed_top = top + 9
    for b in range(nb):
        framed_top = ats[b] if ats[b] > framed_top else framed_top
        low = ats[b] if ats[b] < low else low
    top += 1
    framed_top += 1
    for k in range(n):
        i = cand[k]
        if i < 0 or i >= st.shape[0] or i >= lengths.shape[0]:
            raise IndexError(f"sample {i} of {min(st.shape[0], lengths.shape[0])}")
        s = st[i]
        if release is not None and prev >= 0 and s >> RELEASE_SHIFT != prev >> RELEASE_SHIFT:
            release(prev + framed_top)
        prev = s
        reach = top if lengths[i] == length else framed_top if nb else 0
        if reach and (s + low < 0 or s + reach > size):
            raise IndexError(f"the template's bytes of a span at {s}, past the {size} bytes")
        if lengths[i] == length:
            same = True
            for j in range(r):
                if mask[j] and bv[s + rel[j]] != template[j]:
                    same = False
                    break
            o[k] = same
            continue
        for b in range(nb):
            at = ats[b]
            if bv[s + at] != FRAME_OP:
                continue
            same = True
            for j in range(r):
                off = rel[j] if rel[j] < at else rel[j] + 9
                if mask[j] and bv[s + off] != template[j]:
                    same = False
                    break
            if same:
                o[k] = 1
                break
    if release is not None:
        release(prev + framed_top)
    return out


# -- per-sample bounds: the compiled twin of pickleshard.bounds.measure ---------------------------
#
# bounds._measure_py (and its _leaf, _children, _Walk, _iterative) is the reference: the same
# leaves with the same sizes, containers walked in the same order (a dict: its keys, then its
# values), each distinct container once (by id; a shared one adds its memoized size and height
# again), and the same bound checks at the same points, so the same (bytes, depth) or the same
# _Exceeded(what, value). Only exact list, tuple and dict are walked here, only exact int, str,
# bytes, bytearray, float, bool, None, complex, range, slice and non-object numpy arrays are
# leaves; at any other value the whole sample is answered MEASURE_FALLBACK and the reference walks
# it. The walk keeps its own stack of frames (no C recursion, whatever the depth).
#
# Values are read through borrowed pointers (no reference counting per leaf); each container on
# the stack holds a reference of the walk's own, so nothing it walks can be freed under it. A
# container referenced by its parent alone (reference count 1 when met) can be met only once
# and cannot be on the path (a container on the path also holds the walk's reference), so only
# the others are remembered by id, for sharing and cycles: most containers of a sample never
# cost a dict or set operation.

from cpython.ref cimport PyObject
from libc.stdlib cimport free, malloc

cdef extern from "Python.h":
    ctypedef struct PyTypeObject
    PyTypeObject* Py_TYPE_P "Py_TYPE"(PyObject*)
    Py_ssize_t Py_REFCNT_P "Py_REFCNT"(PyObject*)
    void Py_INCREF_P "Py_INCREF"(PyObject*)
    void Py_DECREF_P "Py_DECREF"(PyObject*)
    Py_ssize_t PyList_GET_SIZE_P "PyList_GET_SIZE"(PyObject*)
    PyObject* PyList_GET_ITEM_P "PyList_GET_ITEM"(PyObject*, Py_ssize_t)
    Py_ssize_t PyTuple_GET_SIZE_P "PyTuple_GET_SIZE"(PyObject*)
    PyObject* PyTuple_GET_ITEM_P "PyTuple_GET_ITEM"(PyObject*, Py_ssize_t)
    Py_ssize_t PyDict_GET_SIZE_P "PyDict_GET_SIZE"(PyObject*)
    bint PyDict_Next_P "PyDict_Next"(PyObject*, Py_ssize_t*, PyObject**, PyObject**)
    Py_ssize_t PyUnicode_GET_LENGTH_P "PyUnicode_GET_LENGTH"(PyObject*)
    Py_ssize_t PyBytes_GET_SIZE_P "PyBytes_GET_SIZE"(PyObject*)
    Py_ssize_t PyByteArray_GET_SIZE_P "PyByteArray_GET_SIZE"(PyObject*)
    long long PyLong_AsLongLongAndOverflow_P "PyLong_AsLongLongAndOverflow"(PyObject*, int*)
    object PyLong_FromVoidPtr(void*)

MEASURE_FALLBACK = object()  # measure_tree's answer for a sample the reference must walk

cdef enum:
    M_REF = 8  # bytes per reference (bounds._REF)
    M_CONTAINER = -1
    M_OTHER = -2
    K_LIST = 0
    K_TUPLE = 1
    K_KEYS = 2
    K_VALUES = 3
    M_LOCAL_FRAMES = 64

cdef PyTypeObject* T_INT = <PyTypeObject*>int
cdef PyTypeObject* T_STR = <PyTypeObject*>str
cdef PyTypeObject* T_FLOAT = <PyTypeObject*>float
cdef PyTypeObject* T_BOOL = <PyTypeObject*>bool
cdef PyTypeObject* T_NONE = Py_TYPE_P(<PyObject*>None)
cdef PyTypeObject* T_LIST = <PyTypeObject*>list
cdef PyTypeObject* T_TUPLE = <PyTypeObject*>tuple
cdef PyTypeObject* T_DICT = <PyTypeObject*>dict
cdef PyTypeObject* T_BYTES = <PyTypeObject*>bytes
cdef PyTypeObject* T_BYTEARRAY = <PyTypeObject*>bytearray
cdef PyTypeObject* T_COMPLEX = <PyTypeObject*>complex
cdef PyTypeObject* T_RANGE = <PyTypeObject*>range
cdef PyTypeObject* T_SLICE = <PyTypeObject*>slice
cdef object _ndarray = np.ndarray  # held here: T_NDARRAY stays valid
cdef PyTypeObject* T_NDARRAY = <PyTypeObject*>_ndarray


cdef int64_t _leaf_c(PyObject* p) except -3:
    """bounds._leaf for the types named above; M_CONTAINER for exact list, tuple and dict,
    M_OTHER for anything else (an object array too: the reference walks its elements)."""
    cdef PyTypeObject* t = Py_TYPE_P(p)
    cdef int overflow = 0
    if t == T_INT:
        PyLong_AsLongLongAndOverflow_P(p, &overflow)  # an exact int: no __index__, no error
        if overflow == 0:  # within [-2**63, 2**63): a small int
            return M_REF
        return <int64_t>((<object>p).bit_length() >> 3)
    if t == T_STR:
        return PyUnicode_GET_LENGTH_P(p)
    if t == T_FLOAT or t == T_BOOL or t == T_NONE:
        return M_REF
    if t == T_LIST or t == T_TUPLE or t == T_DICT:
        return M_CONTAINER
    if t == T_BYTES:
        return PyBytes_GET_SIZE_P(p)
    if t == T_NDARRAY:
        if (<object>p).dtype.hasobject:
            return M_OTHER
        return <int64_t>(<object>p).nbytes
    if t == T_BYTEARRAY:
        return PyByteArray_GET_SIZE_P(p)
    if t == T_COMPLEX:
        return 2 * M_REF
    if t == T_RANGE:
        return 6 * M_REF
    if t == T_SLICE:
        return 3 * M_REF
    return M_OTHER


cdef _exceeded(str what, object value):

    raise BoundExceeded(what, value)


cdef struct _MFrame:
    PyObject* obj  # a reference of the walk's own, dropped when the frame is
    Py_ssize_t pos  # the next child: an index, or PyDict_Next's position
    int kind
    bint tracked  # remembered by id: in `on_path` now, in `done` once walked
    int64_t total
    int64_t height


cdef object _walk_tree(PyObject* sample, int64_t limit, int64_t deepest, bint recursive):
    """bounds._Walk.container(sample, 1) when ``recursive``, else bounds._iterative: they
    differ only at a new container met on the path past the depth bound (the recursive walk
    checks the depth first and reports a cycle at the child's depth, the iterative one checks
    for a cycle first and reports it at the parent's). MEASURE_FALLBACK at a value it does not
    know."""
    cdef _MFrame local[M_LOCAL_FRAMES]
    cdef _MFrame* frames = local
    cdef _MFrame* f
    cdef _MFrame* grown
    cdef Py_ssize_t n = 0, cap = M_LOCAL_FRAMES, i
    cdef int64_t size, h
    cdef PyObject* k
    cdef PyObject* val
    cdef PyObject* obj
    cdef PyObject* child = sample
    cdef PyTypeObject* t
    cdef bint push = True, tracked = True  # the sample: its caller holds it too
    cdef object key, got
    cdef dict done = None  # id -> (bytes, height) of the tracked containers walked
    cdef set on_path = None  # the ids of the tracked containers on the path
    try:
        while True:
            if push:  # `child`, a list, tuple or dict not walked yet, gets a frame
                push = False
                if n == cap:
                    grown = <_MFrame*>malloc(2 * cap * sizeof(_MFrame))
                    if grown == NULL:
                        raise MemoryError()
                    for i in range(n):
                        grown[i] = frames[i]
                    if frames != local:
                        free(frames)
                    frames = grown
                    cap *= 2
                f = &frames[n]
                Py_INCREF_P(child)
                f.obj = child
                n += 1
                f.pos = 0
                f.height = 0
                f.tracked = tracked
                if tracked and on_path is not None:  # (else made when first asked, below)
                    on_path.add(PyLong_FromVoidPtr(child))
                t = Py_TYPE_P(child)
                if t == T_DICT:
                    f.kind = K_KEYS
                    f.total = 2 * M_REF * PyDict_GET_SIZE_P(child)
                elif t == T_LIST:
                    f.kind = K_LIST
                    f.total = M_REF * PyList_GET_SIZE_P(child)
                else:
                    f.kind = K_TUPLE
                    f.total = M_REF * PyTuple_GET_SIZE_P(child)
            f = &frames[n - 1]
            obj = f.obj
            child = NULL
            if f.kind == K_LIST:
                if f.pos < PyList_GET_SIZE_P(obj):  # read each time: the list is not ours
                    child = PyList_GET_ITEM_P(obj, f.pos)
                    f.pos += 1
            elif f.kind == K_TUPLE:
                if f.pos < PyTuple_GET_SIZE_P(obj):
                    child = PyTuple_GET_ITEM_P(obj, f.pos)
                    f.pos += 1
            elif f.kind == K_KEYS:
                if PyDict_Next_P(obj, &f.pos, &k, &val):
                    child = k
                else:  # the keys are done: the values (itertools.chain(v, v.values()))
                    f.kind = K_VALUES
                    f.pos = 0
                    continue
            elif PyDict_Next_P(obj, &f.pos, &k, &val):
                child = val
            if child != NULL:
                size = _leaf_c(child)
                if size == M_OTHER:
                    return MEASURE_FALLBACK
                if size == M_CONTAINER:
                    tracked = Py_REFCNT_P(child) > 1  # else only `obj` refers to it
                    got = None
                    if tracked:
                        key = PyLong_FromVoidPtr(child)
                        if done is not None:
                            got = done.get(key)
                        if on_path is None:  # the tracked containers on the path, so far
                            on_path = set()
                            for i in range(n):
                                if frames[i].tracked:
                                    on_path.add(PyLong_FromVoidPtr(frames[i].obj))
                    if got is None:
                        if recursive:
                            if n + 1 > deepest:
                                _exceeded("depth", n + 1)
                            if tracked and on_path is not None and key in on_path:
                                _exceeded("cycle", n + 1)
                        else:
                            if tracked and on_path is not None and key in on_path:
                                _exceeded("cycle", n)
                            if n >= deepest:
                                _exceeded("depth", n + 1)
                        push = True
                        continue
                    h = (<tuple>got)[1]
                    if n + h > deepest:
                        _exceeded("depth", n + h)
                    size = (<tuple>got)[0]
                    if h > f.height:
                        f.height = h
                if size > limit - f.total:  # total + size > limit, without overflow
                    _exceeded("bytes", f.total + <object>size)
                f.total += size
                continue
            # no children left: the container is done
            size = f.total
            h = f.height + 1
            if f.tracked and n > 1:  # (the sample itself is done with the walk)
                key = PyLong_FromVoidPtr(obj)
                if on_path is not None:
                    on_path.discard(key)
                if done is None:
                    done = {}
                done[key] = (size, h)
            n -= 1
            f.obj = NULL
            Py_DECREF_P(obj)
            if n == 0:
                return (size, h)
            f = &frames[n - 1]
            if h > f.height:
                f.height = h
            if size > limit - f.total:
                _exceeded("bytes", f.total + <object>size)
            f.total += size
    finally:
        for i in range(n):
            Py_DECREF_P(frames[i].obj)
        if frames != local:
            free(frames)


def measure_tree(object sample, int64_t limit, int64_t deepest, bint recursive):
    """bounds._measure_py(sample, ...) with both bounds given (at most 2**62; "no bound" is
    2**62) and the walk it would take (``recursive``: the depth bound is at most
    bounds._RECURSE_MAX): ``(bytes, depth)``, or errors.BoundExceeded raised, or MEASURE_FALLBACK
    when the sample holds a value this walk does not know (the reference must walk it)."""
    cdef int64_t size = _leaf_c(<PyObject*>sample)
    if size == M_OTHER:
        return MEASURE_FALLBACK
    if size >= 0:
        if size > limit:
            _exceeded("bytes", size)
        return (size, 0)
    if recursive and deepest < 1:
        _exceeded("depth", 1)
    return _walk_tree(<PyObject*>sample, limit, deepest, recursive)


cdef object _leaf_total(tuple sample):
    cdef int64_t total = 0, size
    cdef Py_ssize_t i
    for i in range(PyTuple_GET_SIZE_P(<PyObject*>sample)):
        size = _leaf_c(PyTuple_GET_ITEM_P(<PyObject*>sample, i))
        if size == M_OTHER:
            return MEASURE_FALLBACK
        if size < 0:
            return -1
        if size > (1 << 62) - total:  # a sum C cannot hold: the reference adds it
            return MEASURE_FALLBACK
        total += size
    return total


def leaf_total(tuple sample):
    """bounds._leaf_total_py: the sum of the sizes of a tuple of leaves; -1 when it holds a
    container, MEASURE_FALLBACK at a value this module does not know."""
    return _leaf_total(sample)


def check_tree(object sample, int64_t limit, int64_t deepest, bint recursive):
    """bounds.check_sample's test in one call (bounds as for :func:`measure_tree`): a tuple of
    leaves against the byte bound alone (their sum, as check_sample), any other sample
    measured. None when it passes, errors.BoundExceeded raised when not, MEASURE_FALLBACK when the
    reference must decide."""
    return _check_tree(sample, limit, deepest, recursive)


cdef object _check_tree(object sample, int64_t limit, int64_t deepest, bint recursive):
    cdef object total
    if type(sample) is tuple:
        total = _leaf_total(<tuple>sample)
        if total is MEASURE_FALLBACK:
            return total
        if <int64_t>total >= 0:
            if <int64_t>total > limit:
                _exceeded("bytes", total)
            return None
    got = measure_tree(sample, limit, deepest, recursive)
    return got if got is MEASURE_FALLBACK else None


# == object fields decoded into a batch's columns: the compiled twin of read.objectcolumns ======
#
# A span of the common value grammar (ints within int64, bools, floats, str, bytes, None, and
# lists, tuples and dicts of these, with their memo ops, protocols 2-5) is decoded without
# building its value: a stack machine emits the value's shape as tokens (postfix: a leaf's kind;
# a list or dict opened, then each APPENDS / SETITEMS with its count; a tuple with its count)
# and writes its leaves, in stream order, into slot j of the batch's leaf table. The first sample
# decoded sets the batch's shape; a later one of other tokens or dict keys makes the batch ragged:
# the rows decoded so far are built into their values, and every later sample's value is built
# from its tokens and leaves (_build) into ``rows``. A sample outside the grammar makes the call
# decline (OD_DECLINE) and the caller reads that part its own way. The
# reference, read.objectcolumns.ReferenceDecoder, gives the same tokens, leaves and answers.

cdef extern from "Python.h":
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)
    void PyTuple_SET_ITEM_R "PyTuple_SET_ITEM"(object, Py_ssize_t, PyObject*)  # steals it

from cpython.dict cimport PyDict_SetItem
from cpython.float cimport PyFloat_FromDouble
from cpython.list cimport PyList_Append

cdef enum:  # tokens (read.objectcolumns.TOKENS)
    TK_INT = 1
    TK_FLOAT = 2
    TK_BOOL = 3
    TK_STR = 4
    TK_BYTES = 5
    TK_NONE = 6
    TK_LIST = 7
    TK_DICT = 8
    TK_APPENDS = 9
    TK_SETITEMS = 10
    TK_TUPLE = 11
    TK_SHIFT = 8  # a closing token is kind | count << TK_SHIFT

cdef enum:  # answers of ObjectDecoder.decode (read.objectcolumns.OD_*)
    OD_OK = 0
    OD_EXTERNAL = 1
    OD_DECLINE = 2
    OD_SHORT = 3
    OD_RESHAPE = 4  # (inside decode only) a sample of another shape than the batch's first

cdef enum:
    OD_SPAN_MAX = 1 << 26  # a span decoded here is at most this long (else: the reference)
    OD_MARK = -1  # a stack entry that is a MARK
    OD_CONTAINER = -2  # a memo entry that is a container (a GET of it: the reference)
    OD_UNSET = -3

OBJECT_TOKENS = {
    "INT": TK_INT, "FLOAT": TK_FLOAT, "BOOL": TK_BOOL, "STR": TK_STR, "BYTES": TK_BYTES,
    "NONE": TK_NONE, "LIST": TK_LIST, "DICT": TK_DICT, "APPENDS": TK_APPENDS,
    "SETITEMS": TK_SETITEMS, "TUPLE": TK_TUPLE, "SHIFT": TK_SHIFT,
}

cdef struct OEntry:  # a value on the decoder's stack, or a MARK
    int kind  # TK_* of a leaf, TK_LIST / TK_DICT / TK_TUPLE, or OD_MARK
    Py_ssize_t leaf  # a leaf: its index among the sample's leaves
    int64_t height  # a container's height (bounds.measure's)

cdef struct OMemo:
    int kind  # as OEntry.kind, OD_CONTAINER, or OD_UNSET
    Py_ssize_t leaf


cdef class ObjectSpans:
    """One field of one file as :meth:`ObjectDecoder.decode` reads it: the descriptor ``fd``
    (and ``mapped``, the file mapped whole, or None),
    the ``loader`` that checks its identity (None: not checked), the field's span columns
    (``starts``, ``ends``, ``bases``: the scan's arrays, never copied), the memo ``shift`` and
    the file's ``externals`` (memo key -> value, filled by the caller as asked)."""

    cdef int fd
    cdef SpanLoader loader
    cdef const int64_t[:] starts, ends, bases
    cdef int64_t shift
    cdef public dict externals
    cdef object mapping
    cdef const unsigned char[:] mapped

    def __init__(
        self, int fd, SpanLoader loader, starts, ends, bases, int64_t shift, dict externals,
        mapped=None,
    ):
        self.fd, self.loader, self.shift, self.externals = fd, loader, shift, externals
        self.starts, self.ends, self.bases = starts, ends, bases
        self.mapping = mapped  # the file mapped whole: spans copied out of it (guarded)
        self.mapped = mapped if mapped is not None else b""
        if self.ends.shape[0] != self.starts.shape[0] or self.bases.shape[0] != self.starts.shape[0]:
            raise ValueError("an object field's span columns do not agree")


cdef class ObjectDecoder:
    """The object field of ``size`` batch rows decoded into columns (see above). After the
    first sample: :attr:`schema` (its tokens), :attr:`kinds` (each leaf slot's token),
    :attr:`vals` (int64 ``(slots, size)``: an int, a float's bits, a bool as 0/1),
    :attr:`objs` (per slot, a list of ``size`` values for str, bytes and None slots, else None),
    :attr:`keys` (per slot, the key a dict key slot holds, else None), :attr:`sizes` (each
    row's decoded size as ``bounds.measure`` counts it), :attr:`height` (the deepest row's),
    :attr:`filled` (rows decoded); :attr:`ragged` once a sample of another shape was met, then
    :attr:`rows` (each decoded row's value, built here; the table no longer read)."""

    cdef public object schema, kinds, vals, objs, keys, sizes, filled
    cdef public Py_ssize_t size, nleaves
    cdef public int64_t height
    cdef public bint ragged  # its samples differ in shape: each row's value built (rows)
    cdef public list rows  # ragged: per row, its value (None: not decoded)
    cdef list _objs, _keys
    cdef ObjectDecoder prior  # an earlier batch's decoder: its shape is reused when the same
    cdef int64_t[:, ::1] _vals
    cdef int64_t[::1] _sizes
    cdef unsigned char[::1] _filled
    cdef int64_t* _schema
    cdef Py_ssize_t _nschema
    # one sample's work, sized to the longest span of a call
    cdef Py_ssize_t cap
    cdef int64_t* toks
    cdef int64_t* bits
    cdef int* lkind
    cdef PyObject** lobj
    cdef OEntry* stack
    cdef Py_ssize_t* marks
    cdef OMemo* memo
    cdef PyObject** vst  # the values on the stack of _build

    def __init__(self, Py_ssize_t size, ObjectDecoder prior=None):
        self.size, self.nleaves, self.height = size, 0, 0
        self.ragged, self.rows = False, None
        self.schema = self.kinds = self.vals = self.objs = self.keys = None
        self.prior = prior if prior is not None and prior.schema is not None else None
        self.sizes = np.zeros(size, np.int64)
        self.filled = np.zeros(size, np.uint8)
        self._sizes, self._filled = self.sizes, self.filled

    def __dealloc__(self):
        self._free()
        free(self._schema)

    cdef void _free(self) noexcept:
        free(self.toks)
        free(self.bits)
        free(self.lkind)
        free(self.lobj)
        free(self.stack)
        free(self.marks)
        free(self.memo)
        free(self.vst)
        self.vst = NULL
        self.toks = self.bits = NULL
        self.lkind = NULL
        self.lobj = NULL
        self.stack = NULL
        self.marks = NULL
        self.memo = NULL
        self.cap = 0

    cdef int _room(self, Py_ssize_t n) except -1:
        if n + 2 <= self.cap:
            return 0
        self._free()
        n = n + 2
        self.toks = <int64_t*>malloc(n * sizeof(int64_t))
        self.bits = <int64_t*>malloc(n * sizeof(int64_t))
        self.lkind = <int*>malloc(n * sizeof(int))
        self.lobj = <PyObject**>calloc(n, sizeof(PyObject*))
        self.stack = <OEntry*>malloc(n * sizeof(OEntry))
        self.marks = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
        self.memo = <OMemo*>malloc(n * sizeof(OMemo))
        self.vst = <PyObject**>malloc(n * sizeof(PyObject*))
        if (self.toks == NULL or self.bits == NULL or self.lkind == NULL or self.lobj == NULL
                or self.stack == NULL or self.marks == NULL or self.memo == NULL
                or self.vst == NULL):
            self._free()
            raise MemoryError()
        self.cap = n
        return 0

    cdef void _drop(self, Py_ssize_t nl) noexcept:
        """Let go of the objects of the first ``nl`` leaves of the sample decoded last."""
        cdef Py_ssize_t j
        for j in range(nl):
            if self.lobj[j] != NULL:
                Py_DECREF_P(self.lobj[j])
                self.lobj[j] = NULL

    def decode(
        self, list srcs, const int64_t[:] cuts, const int64_t[:] items, const int64_t[:] rows,
        object labels, Py_ssize_t first, int64_t[:] nbytes, bint identity=True,
    ):
        """Decode, for each file ``g``, the field spans of ``srcs[g]`` (:class:`ObjectSpans`):
        ``[starts[i], ends[i])`` (their first memo id ``bases[i]``; a GET's id plus ``shift``
        is its memo key) of samples ``i = items[j]`` into rows ``rows[j]``, for ``j`` in
        ``cuts[g]:cuts[g + 1]`` from ``first`` on, copied out of the file's mapping (guarded)
        or read by ``pread`` with the GIL released; an external memo key's value is
        ``externals[key]``; after each file's reads its identity is checked by its ``loader``
        (None: not; ``identity`` False: not in this call, the caller checks it after its last
        field's reads), the error naming ``labels[j]`` of its samples.
        Returns ``(answer, j, key, g, largest)``: OD_OK (``j`` = ``len(items)``),
        OD_EXTERNAL (``key`` is not in file ``g``'s ``externals``: resolve it, call again from
        ``j``), OD_DECLINE (sample ``j`` of file ``g`` is outside the grammar or not of the
        batch's shape) or OD_SHORT (its read came short); ``largest`` of the decoded rows'
        sizes; ``nbytes[g]`` counts the bytes read from file ``g``."""
        cdef Py_ssize_t g, a, b, ng = len(srcs)
        cdef int64_t largest = 0
        cdef tuple got
        cdef bint guarded = ps_guard_sigbus() == 0  # once per call: copies out of mappings
        if (cuts.shape[0] != ng + 1 or nbytes.shape[0] != ng or rows.shape[0] != items.shape[0]
                or len(labels) != items.shape[0]):
            raise ValueError(f"{ng} files, {cuts.shape[0]} cuts, {items.shape[0]} items")
        for g in range(ng):
            a, b = cuts[g], cuts[g + 1]
            if not 0 <= a <= b <= items.shape[0]:
                raise IndexError(f"cut {a}:{b} of {items.shape[0]}")
            if b <= first:
                continue
            got = self._one(
                <ObjectSpans?>srcs[g], items[a:b], rows[a:b], labels[a:b], max(first - a, 0),
                guarded, identity,
            )
            nbytes[g] += <int64_t>got[3]
            if <int64_t>got[4] > largest:
                largest = got[4]
            if got[0] != OD_OK:
                return (got[0], a + <Py_ssize_t>got[1], got[2], g, largest)
        return (OD_OK, items.shape[0], 0, ng, largest)

    cdef tuple _one(
        self, ObjectSpans src, const int64_t[:] items, const int64_t[:] rows, object labels,
        Py_ssize_t first, bint guarded, bint identity,
    ):
        """:meth:`decode` of one file: ``(answer, j, key, nbytes, largest)``."""
        cdef const int64_t[:] starts = src.starts, ends = src.ends, bases = src.bases
        cdef int fd = src.fd
        cdef SpanLoader loader = src.loader
        cdef Py_ssize_t m = items.shape[0], n = starts.shape[0], j, i, total = 0, longest = 0
        cdef Py_ssize_t got, k
        cdef int64_t largest = 0, key = 0
        cdef int answer = OD_OK
        cdef unsigned char* buf = NULL
        cdef Py_ssize_t* at = NULL
        if rows.shape[0] != m or ends.shape[0] != n or bases.shape[0] != n or not 0 <= first <= m:
            raise ValueError(f"{m} items, {rows.shape[0]} rows, {n} starts, first {first}")
        for j in range(first, m):  # everything checked before the first read
            i = items[j]
            if not 0 <= i < n:
                raise IndexError(f"item {i} of {n}")
            if not 0 <= rows[j] < self.size:
                raise IndexError(f"row {rows[j]} of {self.size}")
            k = ends[i] - starts[i]
            if k <= 0 or k > OD_SPAN_MAX or starts[i] < 0:
                return (OD_DECLINE, j, 0, 0, 0)
            total += k
            if k > longest:
                longest = k
        if first == m:
            return (OD_OK, m, 0, 0, 0)
        self._room(longest)
        buf = <unsigned char*>malloc(total + 1)
        at = <Py_ssize_t*>malloc((m - first + 1) * sizeof(Py_ssize_t))
        if buf == NULL or at == NULL:
            free(buf)
            free(at)
            raise MemoryError()
        try:
            at[0] = 0
            for j in range(first, m):
                i = items[j]
                at[j - first + 1] = at[j - first] + ends[i] - starts[i]
            j = first
            if guarded and src.mapped.shape[0] and self._copied(src, items, first, buf, at):
                j = m
            with nogil:
                while j < m:
                    i = items[j]
                    k = ends[i] - starts[i]
                    got = pread(fd, buf + at[j - first], <size_t>k, starts[i])
                    if got != k:
                        break
                    j += 1
            if j < m:
                return (OD_SHORT, j, 0, at[j - first], 0)
            if identity and loader is not None and loader.verify and loader._differs(fd):
                raise loader.stale(None, -1, [int(v) for v in labels[first:]])
            for j in range(first, m):
                i = items[j]
                answer = self._sample(
                    buf + at[j - first], ends[i] - starts[i], bases[i], src.shift, src.externals,
                    rows[j], &key,
                )
                if answer == OD_RESHAPE:  # a ragged batch: every row's value built from now on
                    self._go_ragged()
                    answer = self._sample(
                        buf + at[j - first], ends[i] - starts[i], bases[i], src.shift,
                        src.externals, rows[j], &key,
                    )
                if answer != OD_OK:
                    return (answer, j, key, total, largest)
                if self._sizes[rows[j]] > largest:
                    largest = self._sizes[rows[j]]
            return (OD_OK, m, 0, total, largest)
        finally:
            free(buf)
            free(at)

    cdef int _sample(
        self, const unsigned char* p, Py_ssize_t n, int64_t base, int64_t shift,
        dict externals, Py_ssize_t row, int64_t* missing,
    ) except -1:
        """One span decoded into row ``row`` (see :meth:`decode`); its answer."""
        cdef Py_ssize_t pos = 0, sp = 0, nm = 0, nl = 0, nt = 0, nmemo = 0, j, c, a, ln
        cdef int op, kind = 0, mode = 0  # mode: 1 MEMOIZE seen, 2 PUT seen
        cdef int64_t v = 0, size = 0, h, ident
        cdef uint64_t u
        cdef bint learn = self.schema is None or self.ragged  # its tokens kept, not checked
        cdef const int64_t* sch = self._schema
        cdef Py_ssize_t nsch = self._nschema
        cdef object o
        cdef PyObject* po
        cdef int answer = OD_DECLINE
        for j in range(n):
            self.memo[j].kind = OD_UNSET
        try:
            while pos < n:
                op = p[pos]
                pos += 1
                kind = 0
                if op == 0x4b or op == 0x4d or op == 0x4a or op == 0x8a:  # BININT1/2, BININT, LONG1
                    if op == 0x4b:
                        ln = 1
                    elif op == 0x4d:
                        ln = 2
                    elif op == 0x4a:
                        ln = 4
                    else:
                        if pos >= n:
                            return OD_DECLINE
                        ln = p[pos]
                        pos += 1
                        if ln > 8:
                            return OD_DECLINE
                    if pos + ln > n:
                        return OD_DECLINE
                    u = _le_at(p + pos, <int>ln)
                    if (op == 0x4a or op == 0x8a) and 0 < ln < 8 and (p[pos + ln - 1] & 0x80):
                        u |= ~((<uint64_t>1 << (8 * ln)) - 1)  # sign-extended
                    v = <int64_t>u
                    pos += ln
                    kind = TK_INT
                elif op == 0x47:  # BINFLOAT: big-endian, its bits as an int64
                    if pos + 8 > n:
                        return OD_DECLINE
                    u = 0
                    for c in range(8):
                        u = (u << 8) | p[pos + c]
                    v = <int64_t>u
                    pos += 8
                    kind = TK_FLOAT
                elif op == 0x88 or op == 0x89:  # NEWTRUE, NEWFALSE
                    v = op == 0x88
                    kind = TK_BOOL
                elif op == 0x4e:  # NONE
                    v, kind = 0, TK_NONE
                elif op == 0x8c or op == 0x58 or op == 0x8d or op == 0x43 or op == 0x42 or op == 0x8e:
                    ln = 1 if op == 0x8c or op == 0x43 else (4 if op == 0x58 or op == 0x42 else 8)
                    if pos + ln > n:
                        return OD_DECLINE
                    u = _le_at(p + pos, <int>ln)
                    pos += ln
                    if u > <uint64_t>(n - pos):
                        return OD_DECLINE
                    if op == 0x8c or op == 0x58 or op == 0x8d:
                        try:
                            o = PyUnicode_DecodeUTF8(<const char*>(p + pos), <Py_ssize_t>u, "surrogatepass")
                        except UnicodeDecodeError:
                            return OD_DECLINE
                        kind = TK_STR
                        size += PyUnicode_GET_LENGTH_P(<PyObject*>o)
                    else:
                        o = PyBytes_FromStringAndSize(<const char*>(p + pos), <Py_ssize_t>u)
                        kind = TK_BYTES
                        size += <int64_t>u
                    pos += <Py_ssize_t>u
                    Py_INCREF(o)
                    self.lobj[nl] = <PyObject*>o
                    v = 0
                elif op == 0x68 or op == 0x6a:  # BINGET, LONG_BINGET
                    ln = 1 if op == 0x68 else 4
                    if pos + ln > n:
                        return OD_DECLINE
                    u = _le_at(p + pos, <int>ln)
                    pos += ln
                    ident = <int64_t>u + shift
                    if ident < base:  # an external value: a leaf, or the reference reads it
                        v = 0
                        o = externals.get(ident, externals)
                        if o is externals:
                            missing[0] = ident
                            return OD_EXTERNAL
                        if type(o) is int:
                            v = o  # raises past int64: declined below
                            kind = TK_INT
                        elif type(o) is float:
                            kind = TK_FLOAT
                            v = _float_bits(<double>o)
                        elif type(o) is bool:
                            v, kind = (1 if o else 0), TK_BOOL
                        elif type(o) is str:
                            kind = TK_STR
                            size += PyUnicode_GET_LENGTH_P(<PyObject*>o)
                        elif type(o) is bytes:
                            kind = TK_BYTES
                            size += PyBytes_GET_SIZE_P(<PyObject*>o)
                        elif o is None:
                            v, kind = 0, TK_NONE
                        else:
                            return OD_DECLINE
                        if kind == TK_STR or kind == TK_BYTES or kind == TK_NONE:
                            Py_INCREF(o)
                            self.lobj[nl] = <PyObject*>o
                    else:
                        ident -= base
                        if ident >= n or self.memo[ident].kind == OD_UNSET:
                            return OD_DECLINE
                        kind = self.memo[ident].kind
                        if kind == OD_CONTAINER:
                            return OD_DECLINE
                        a = self.memo[ident].leaf
                        v = self.bits[a]
                        po = self.lobj[a]
                        if po != NULL:
                            Py_INCREF_P(po)
                            self.lobj[nl] = po
                            if kind == TK_STR:
                                size += PyUnicode_GET_LENGTH_P(po)
                            elif kind == TK_BYTES:
                                size += PyBytes_GET_SIZE_P(po)
                elif op == 0x94 or op == 0x71 or op == 0x72:  # MEMOIZE, BINPUT, LONG_BINPUT
                    if sp == 0 or self.stack[sp - 1].kind == OD_MARK:
                        return OD_DECLINE
                    if op == 0x94:
                        if mode == 2:
                            return OD_DECLINE
                        mode, ident = 1, nmemo
                        nmemo += 1
                    else:
                        if mode == 1:
                            return OD_DECLINE
                        ln = 1 if op == 0x71 else 4
                        if pos + ln > n:
                            return OD_DECLINE
                        u = _le_at(p + pos, <int>ln)
                        pos += ln
                        mode, ident = 2, <int64_t>u + shift - base
                    if ident < 0 or ident >= n:
                        return OD_DECLINE
                    c = self.stack[sp - 1].kind
                    self.memo[ident].kind = c if c <= TK_NONE else OD_CONTAINER
                    self.memo[ident].leaf = self.stack[sp - 1].leaf
                    continue
                elif op == 0x95:  # FRAME: framing, not the value
                    if pos + 8 > n:
                        return OD_DECLINE
                    pos += 8
                    continue
                elif op == 0x28:  # MARK
                    self.marks[nm] = sp
                    nm += 1
                    self.stack[sp].kind = OD_MARK
                    sp += 1
                    continue
                elif op == 0x5d or op == 0x7d or op == 0x29:  # EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE
                    kind = TK_LIST if op == 0x5d else (TK_DICT if op == 0x7d else TK_TUPLE)
                    self.stack[sp].kind, self.stack[sp].leaf, self.stack[sp].height = kind, -1, 1
                    sp += 1
                    if not self._tok(kind, learn, nt, sch, nsch):
                        return OD_RESHAPE
                    nt += 1
                    continue
                elif op == 0x61 or op == 0x65 or op == 0x73 or op == 0x75 or op == 0x74 or op == 0x85 or op == 0x86 or op == 0x87:
                    if op == 0x61:  # APPEND
                        a, c = sp - 1, 1
                    elif op == 0x73:  # SETITEM
                        a, c = sp - 2, 2
                    elif op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1-3
                        c = op - 0x84
                        a = sp - c
                    else:  # APPENDS, SETITEMS, TUPLE: the items since the last MARK
                        if nm == 0:
                            return OD_DECLINE
                        nm -= 1
                        a = self.marks[nm] + 1
                        c = sp - a
                    if a < 0:
                        return OD_DECLINE
                    h = 0
                    for j in range(a, sp):
                        if self.stack[j].kind == OD_MARK:
                            return OD_DECLINE
                        if self.stack[j].leaf < 0 and self.stack[j].height > h:
                            h = self.stack[j].height
                    if op == 0x74 or op == 0x85 or op == 0x86 or op == 0x87:
                        if op == 0x74:
                            a -= 1  # the MARK goes too
                        sp = a
                        self.stack[sp].kind, self.stack[sp].leaf, self.stack[sp].height = TK_TUPLE, -1, h + 1
                        sp += 1
                        size += 8 * c
                        if not self._tok(TK_TUPLE | (c << TK_SHIFT), learn, nt, sch, nsch):
                            return OD_RESHAPE
                        nt += 1
                        continue
                    ln = a - 1 if (op == 0x61 or op == 0x73) else a - 2  # the container
                    if ln < 0:
                        return OD_DECLINE
                    if op == 0x61 or op == 0x65:
                        if self.stack[ln].kind != TK_LIST:
                            return OD_DECLINE
                        kind = TK_APPENDS | (c << TK_SHIFT)
                        size += 8 * c
                    else:
                        if self.stack[ln].kind != TK_DICT or c % 2:
                            return OD_DECLINE
                        for j in range(a, sp, 2):  # keys: str leaves, the batch's
                            if self.stack[j].kind != TK_STR:
                                return OD_DECLINE
                            if not learn and not self._same_key(self.stack[j].leaf):
                                return OD_RESHAPE
                        c //= 2
                        kind = TK_SETITEMS | (c << TK_SHIFT)
                        size += 16 * c
                    if h + 1 > self.stack[ln].height:
                        self.stack[ln].height = h + 1
                    sp = ln + 1
                    if not self._tok(kind, learn, nt, sch, nsch):
                        return OD_RESHAPE
                    nt += 1
                    continue
                else:
                    return OD_DECLINE
                # a leaf
                if kind == TK_INT or kind == TK_FLOAT or kind == TK_BOOL or kind == TK_NONE:
                    size += 8
                self.bits[nl], self.lkind[nl] = v, kind
                self.stack[sp].kind, self.stack[sp].leaf, self.stack[sp].height = kind, nl, 0
                sp += 1
                nl += 1
                if not self._tok(kind, learn, nt, sch, nsch):
                    return OD_RESHAPE
                nt += 1
            if sp != 1 or nm != 0:
                return OD_DECLINE
            if not learn and nt != nsch:
                return OD_RESHAPE
            if self.ragged:
                self._put_value(row, nt, nl, size)
            else:
                if learn:
                    self._learn(nt, nl)
                self._put(row, nl, size)
            answer = OD_OK
            return OD_OK
        except OverflowError:  # an external int past int64
            return OD_DECLINE
        finally:
            if answer != OD_OK:
                self._drop(self.cap - 2)

    cdef bint _copied(
        self, ObjectSpans src, const int64_t[:] items, Py_ssize_t first, unsigned char* buf,
        Py_ssize_t* at,
    ) except -1:
        """Copy the spans out of ``src``'s mapping (the caller installed the SIGBUS guard: a
        file cut short under it raises none); False where it cannot (the caller reads them by
        ``pread``)."""
        cdef Py_ssize_t m = items.shape[0], j, i, k = 0
        cdef const unsigned char* base = &src.mapped[0]
        cdef Py_ssize_t size = src.mapped.shape[0]
        cdef char** dst = <char**>malloc((m - first + 1) * sizeof(char*))
        cdef const char** frm = <const char**>malloc((m - first + 1) * sizeof(char*))
        cdef size_t* n = <size_t*>malloc((m - first + 1) * sizeof(size_t))
        cdef int r = -1
        try:
            if dst == NULL or frm == NULL or n == NULL:
                raise MemoryError()
            for j in range(first, m):
                i = items[j]
                if src.ends[i] > size:
                    return False  # grown since it was mapped: pread reads it all
                dst[k], frm[k] = <char*>(buf + at[j - first]), <const char*>(base + src.starts[i])
                n[k] = <size_t>(src.ends[i] - src.starts[i])
                k += 1
            with nogil:
                r = ps_copy_guarded(dst, frm, n, k, 0)
            return r == 0
        finally:
            free(dst)
            free(frm)
            free(n)

    cdef bint _tok(self, int64_t t, bint learn, Py_ssize_t nt, const int64_t* sch, Py_ssize_t nsch):
        """Token ``t`` emitted at position ``nt``: kept (learning) or checked against the shape."""
        if learn:
            self.toks[nt] = t
            return True
        return nt < nsch and sch[nt] == t

    cdef bint _same_key(self, Py_ssize_t leaf) except -1:
        """Whether leaf ``leaf`` (a dict key) is the batch's key in its slot."""
        cdef object want = self._keys[leaf]
        cdef PyObject* got = self.lobj[leaf]
        if want is None or got == NULL:
            return False
        return <PyObject*>want == got or bool(<object>got == want)

    cdef int _learn(self, Py_ssize_t nt, Py_ssize_t nl) except -1:
        """The first sample's shape becomes the batch's: its tokens, slots, keys."""
        cdef Py_ssize_t j
        self._schema = <int64_t*>malloc((nt + 1) * sizeof(int64_t))
        if self._schema == NULL:
            raise MemoryError()
        memcpy(self._schema, self.toks, nt * sizeof(int64_t))
        self._nschema = nt
        self.nleaves = nl
        self.vals = np.zeros((nl, self.size), np.int64)
        self._vals = self.vals
        self.height = self.stack[0].height if self.stack[0].leaf < 0 else 0
        cdef ObjectDecoder p = self.prior
        self.prior = None  # not kept: it holds an earlier batch's values
        if p is not None and p._same_shape(self.toks, nt, self.lobj, nl):
            self.schema, self.kinds, self._keys = p.schema, p.kinds, p._keys
            self.keys = self._keys
            self._objs = [None if c is None else [None] * self.size for c in p._objs]
            self.objs = self._objs
            return 0
        self.schema = [self.toks[j] for j in range(nt)]
        self.kinds = [self.lkind[j] for j in range(nl)]
        self._objs = [
            [None] * self.size if self.lkind[j] in (TK_STR, TK_BYTES, TK_NONE) else None
            for j in range(nl)
        ]
        self.objs = self._objs
        self._keys = _key_slots(self.schema, self.kinds, [
            <object>self.lobj[j] if self.lobj[j] != NULL else None for j in range(nl)
        ])
        self.keys = self._keys
        return 0

    cdef bint _same_shape(self, int64_t* toks, Py_ssize_t nt, PyObject** lobj, Py_ssize_t nl):
        """Whether a sample of tokens ``toks`` and leaves ``lobj`` has this decoder's shape
        and keys (then its schema, kinds and keys serve a later batch as they are)."""
        cdef Py_ssize_t j
        cdef object want
        if nt != self._nschema or nl != self.nleaves or memcmp(toks, self._schema, nt * sizeof(int64_t)):
            return False
        for j in range(nl):
            want = self._keys[j]
            if want is not None and (lobj[j] == NULL or not (<PyObject*>want == lobj[j] or want == <object>lobj[j])):
                return False
        return True

    cdef int _go_ragged(self) except -1:
        """The batch is ragged: the rows decoded so far (one shape: the table's) become their
        values in :attr:`rows`, and every later sample's value is built as it is decoded."""
        cdef Py_ssize_t r, j, nl = self.nleaves
        cdef list rows = [None] * self.size
        cdef object col
        self._room(self._nschema)
        for r in range(self.size):
            if not self._filled[r]:
                continue
            for j in range(nl):  # the row's leaves, borrowed from the table
                self.bits[j] = self._vals[j, r]
                col = self._objs[j]
                self.lobj[j] = NULL if col is None else PyList_GET_ITEM(col, r)
            try:
                rows[r] = self._build(self._schema, self._nschema)
            finally:
                for j in range(nl):
                    self.lobj[j] = NULL
        self.rows, self.ragged = rows, True  # the table stays: a later batch's prior reads it
        return 0

    cdef int _put_value(self, Py_ssize_t row, Py_ssize_t nt, Py_ssize_t nl, int64_t size) except -1:
        """A ragged batch's sample: its value built into ``rows[row]``, its leaves let go."""
        cdef int64_t h = self.stack[0].height if self.stack[0].leaf < 0 else 0
        self.rows[row] = self._build(self.toks, nt)
        self._drop(nl)
        self._sizes[row] = size
        self._filled[row] = 1
        if h > self.height:
            self.height = h
        return 0

    cdef object _build(self, const int64_t* toks, Py_ssize_t nt):
        """The value of a sample of tokens ``toks[:nt]`` and leaves ``bits`` / ``lobj`` (in
        stream order), as unpickling its span builds it: the tokens replayed on a stack."""
        cdef PyObject** st = self.vst
        cdef Py_ssize_t sp = 0, leaf = 0, t, c, j, at
        cdef int64_t tok
        cdef int kind
        cdef double d
        cdef object o, box
        cdef PyObject* po
        try:
            for t in range(nt):
                tok = toks[t]
                kind = <int>(tok & ((1 << TK_SHIFT) - 1))
                c = <Py_ssize_t>(tok >> TK_SHIFT)
                if kind == TK_INT:
                    o = PyLong_FromLongLong(self.bits[leaf])
                    leaf += 1
                elif kind == TK_FLOAT:
                    memcpy(&d, &self.bits[leaf], 8)
                    o = PyFloat_FromDouble(d)
                    leaf += 1
                elif kind == TK_BOOL:
                    o = True if self.bits[leaf] else False
                    leaf += 1
                elif kind <= TK_NONE:  # str, bytes, None: the object decoded (None: NULL)
                    po = self.lobj[leaf]
                    o = <object>po if po != NULL else None
                    leaf += 1
                elif kind == TK_LIST:
                    o = []
                elif kind == TK_DICT:
                    o = {}
                elif kind == TK_TUPLE:
                    if c > sp:
                        raise ValueError("a ragged sample's tokens do not replay")
                    o = PyTuple_New(c)
                    for j in range(c):  # the stack's references go to the tuple
                        PyTuple_SET_ITEM_R(o, j, st[sp - c + j])
                    sp -= c
                elif kind == TK_APPENDS:
                    at = sp - c - 1
                    if at < 0:
                        raise ValueError("a ragged sample's tokens do not replay")
                    box = <object>st[at]
                    for j in range(at + 1, sp):
                        PyList_Append(box, <object>st[j])
                    for j in range(at + 1, sp):
                        Py_DECREF_P(st[j])
                    sp = at + 1
                    continue
                else:  # SETITEMS
                    at = sp - 2 * c - 1
                    if at < 0:
                        raise ValueError("a ragged sample's tokens do not replay")
                    box = <object>st[at]
                    for j in range(at + 1, sp, 2):
                        PyDict_SetItem(box, <object>st[j], <object>st[j + 1])
                    for j in range(at + 1, sp):
                        Py_DECREF_P(st[j])
                    sp = at + 1
                    continue
                Py_INCREF(o)
                st[sp] = <PyObject*>o
                sp += 1
            if sp != 1:
                raise ValueError("a ragged sample's tokens do not replay")
            return <object>st[0]
        finally:
            for j in range(sp):
                Py_DECREF_P(st[j])

    cdef int _put(self, Py_ssize_t row, Py_ssize_t nl, int64_t size) except -1:
        """The sample's leaves into row ``row`` (their objects handed to the slot lists)."""
        cdef Py_ssize_t j
        cdef list col
        for j in range(nl):
            self._vals[j, row] = self.bits[j]
            if self.lobj[j] != NULL:
                col = <list?>self._objs[j]
                col[row] = <object>self.lobj[j]
                Py_DECREF_P(self.lobj[j])
                self.lobj[j] = NULL
        self._sizes[row] = size
        self._filled[row] = 1
        return 0


cdef int64_t _float_bits(double d) noexcept:
    cdef int64_t b
    memcpy(&b, &d, 8)
    return b


cdef list _key_slots(list schema, list kinds, list objs):
    """Per leaf slot, the key it holds when it is a dict's key (else None), from the first
    sample's tokens: replays the stack of leaf slots (a container holds -1)."""
    cdef list stack = [], keys = [None] * len(kinds)
    cdef Py_ssize_t leaf = 0, c
    cdef int64_t t
    for t in schema:
        kind, c = t & ((1 << TK_SHIFT) - 1), t >> TK_SHIFT
        if kind <= TK_NONE:
            stack.append(leaf)
            leaf += 1
        elif kind == TK_LIST or kind == TK_DICT:
            stack.append(-1)
        elif kind == TK_TUPLE:
            if c:
                del stack[len(stack) - c:]
            stack.append(-1)
        elif kind == TK_APPENDS:
            del stack[len(stack) - c:]
        else:  # SETITEMS
            for k in stack[len(stack) - 2 * c::2]:
                keys[k] = objs[k]
            del stack[len(stack) - 2 * c:]
    return keys


# ---- the shuffle's keyed bijection, compiled (its reference: samplers/shuffle.py's numpy
# FeistelPermutation, whose docstring defines it). numpy's version makes a temporary per
# operation and walks every value's cycle in whole-array steps: 0.3 us a sample of a pass,
# as much as a DataLoader's batch read of 12 KB arrays spends on the rest of a sample.

cdef inline uint64_t _splitmix64(uint64_t z) noexcept nogil:
    z = z * <uint64_t>0x9E3779B97F4A7C15ULL
    z ^= z >> 30
    z = z * <uint64_t>0xBF58476D1CE4E5B9ULL
    z ^= z >> 27
    z = z * <uint64_t>0x94D049BB133111EBULL
    z ^= z >> 31
    return z


@cython.boundscheck(False)
@cython.wraparound(False)
def feistel_permute(
    const int64_t[::1] positions, const uint64_t[::1] keys, int half_bits, uint64_t n,
    int64_t[::1] out,
):
    """``out[i] = perm(positions[i])``: the balanced Feistel network on ``2 * half_bits`` bits
    with round keys ``keys``, restricted to ``[0, n)`` by cycle walking. ``ValueError`` for a
    position outside ``[0, n)`` (its cycle need not come back into range)."""
    cdef Py_ssize_t i, k, m = positions.shape[0], nk = keys.shape[0]
    cdef uint64_t mask, x, left, right, t
    cdef int64_t bad = -1
    if out.shape[0] != m:
        raise ValueError(f"out holds {out.shape[0]} values for {m} positions")
    if not 1 <= half_bits <= 32:
        raise ValueError(f"half_bits must be in [1, 32], got {half_bits}")
    mask = (<uint64_t>1 << half_bits) - 1
    with nogil:
        for i in range(m):
            if positions[i] < 0 or <uint64_t>positions[i] >= n:
                bad = i
                break
            x = <uint64_t>positions[i]
            while True:
                left, right = x >> half_bits, x & mask
                for k in range(nk):
                    t = left ^ (_splitmix64(right ^ keys[k]) & mask)
                    left = right
                    right = t
                x = (left << half_bits) | right
                if x < n:
                    break
            out[i] = <int64_t>x
    if bad >= 0:
        raise ValueError(f"position {positions[bad]} is outside [0, {n})")

