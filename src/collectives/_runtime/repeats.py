"""The one cache of remembered calls, and its one "nothing changed" test.

A training loop calls the same collective on the same arrays every step. The blocking
``allreduce``, ``alltoall`` and ``barrier`` (``api.py``), ``iallreduce``
(``engine/nonblocking.py``), ``send`` and ``recv`` (``pt2pt/messages.py``) remember what the
first call on a pair of arrays checked and decided, in :data:`REPEATS`, and repeat it while
:meth:`Repeats.find` finds that nothing that could change in place has (a barrier has no
arrays: a stand-in array takes their place):

- an entry (:class:`Repeat`) is keyed by the call's form ("allreduce", "iallreduce"), the
  identities of ``x``, ``out`` and ``comm``, and the names of op and algorithm (a point-to-point
  message's tag and peer, ``pt2pt/messages.py``, in their places); it holds the
  arrays by weak references only, and the ``options=`` argument it was made with (``None``
  included: a remembered call made without options keeps the environment's options of its
  first call, as NCCL and MPI read their environment once, at initialisation);
- what each array kind could change in place is read by its fingerprint function, from the
  explicit table :data:`KINDS` (NumPy: shape, strides, dtype, write flag -- the flag for the
  arrays the call writes only; a PyTorch tensor: data pointer, shape, strides, dtype,
  ``requires_grad``; CuPy: data pointer, shape, strides, dtype), the same code for every form;
  a pair of NumPy arrays, the common case, and a pair of tensors have their fingerprints
  compared field by field in line, which builds no tuple (tested against the fingerprint
  functions; a tensor's five reads are most of what a repeat on tensors costs over one on
  NumPy arrays: docs/benchmarks/overhead.md). A tensor's device is
  not read: its data pointer implies it (CUDA's unified virtual addressing gives host and
  device memory, and each device's, disjoint addresses), and every attribute read of a tensor
  counts at 8 B (docs/benchmarks/overhead.md);
- the views a run reads and writes are the arrays themselves (1-D NumPy or CuPy of a built-in
  dtype), their flat views made again at each repeat (NumPy, CuPy), or, for tensors, views of
  their memory made once (:func:`.arrays.unowned`: keeping nothing alive, used only while the
  tensor still reports the same memory);
- the communicator's state: the entry's ``where`` (the blocking call's context, the engine) is
  ``live``, neither freed nor reset;
- the last :attr:`Repeats.RECENT` entries used are compared by identity before the keyed
  lookup, so that a loop of a few calls builds no key; the :attr:`Repeats.SIZE` most recently
  used entries are kept.

What an entry runs differs by form (the subclasses in ``api.py`` and ``engine/nonblocking.py``);
finding, keeping, evicting and re-checking are this module's. Persistent plans
(``allreduce_init``) are the caller's own objects and need no cache (the call object is the
plan, as Gloo's): they hold their arrays and re-check the same communicator state (``live``).
"""

from __future__ import annotations

import sys
import weakref
from operator import attrgetter
from typing import Any, Callable

import numpy as np

from .arrays import flat, unowned

__all__ = ["NO_ARRAYS", "Kind", "KINDS", "kind_of", "Repeat", "Repeats", "REPEATS"]


class Kind:
    """An array kind a remembered call can take: its fingerprint (what could change in place
    without the object changing), the fingerprint of an array the call only reads (``read``:
    the same, or less where what changed matters to a write only, as NumPy's write flag), and
    whether a repeat keeps the first call's views of its memory (tensors: making them again is
    what costs)."""

    __slots__ = ("name", "fingerprint", "read", "keeps_views")

    def __init__(self, name: str, fingerprint: Callable[[Any], tuple], keeps_views: bool,
                 read: Callable[[Any], tuple] | None = None) -> None:
        self.name, self.fingerprint, self.keeps_views = name, fingerprint, keeps_views
        self.read = fingerprint if read is None else read


def _tensor(t: Any) -> tuple:
    """A PyTorch tensor's fingerprint: ``set_``, ``resize_``, ``as_strided_``, ``t_``,
    ``.data = `` and ``requires_grad_`` change it; ``data_ptr()`` includes the storage offset
    and implies the device (the module docstring). Its layout is ``True`` where it is
    C-contiguous (every layout of its shape that addresses memory the same way: only the strides
    of dimensions of length 1 may differ), else its strides: ``is_contiguous()`` reads less than
    ``stride()``, which builds a tuple, and a call's tensors are C-contiguous as a rule."""
    return (t.data_ptr(), t.shape, t.is_contiguous() or t.stride(), t.dtype, t.requires_grad)


_NUMPY = Kind("numpy", attrgetter("shape", "strides", "dtype", "flags.writeable"), False,
              read=attrgetter("shape", "strides", "dtype"))


def _no_fields(a: Any) -> tuple:
    return ()


#: the kind of the stand-in of a call with no arrays (``barrier``): nothing to re-check
NO_ARRAYS = Kind("none", _no_fields, False)

_TORCH = Kind("torch", _tensor, True)

#: the array kinds a call is remembered for, by (module, type name): exact types only (a
#: subclass may redefine what its attributes mean); torch and cupy are looked up in
#: ``sys.modules``, never imported
KINDS: dict[tuple[str, str], Kind] = {
    ("numpy", "ndarray"): _NUMPY,
    ("torch", "Tensor"): _TORCH,
    ("cupy", "ndarray"): Kind("cupy", attrgetter("data.ptr", "shape", "strides", "dtype"), False),
}


def kind_of(a: Any) -> Kind | None:
    """The :class:`Kind` of ``a`` from :data:`KINDS`, or None (not remembered)."""
    t = type(a)
    if t is np.ndarray:
        return _NUMPY
    for (module, name), kind in KINDS.items():
        found = sys.modules.get(module)
        if found is not None and t is getattr(found, name, None):
            return kind
    return None


class Repeat:
    """One remembered call: its arguments (weakly), the fingerprints of its arrays, its views,
    and where it runs (``where.live``). The forms subclass it with what their repeat runs."""

    __slots__ = ("x", "out", "form", "op", "algorithm", "comm_arg", "options", "opts", "where",
                 "xprint", "oprint", "xseen", "oseen", "inplace", "vector", "src", "dst", "pair",
                 "numpy", "torch", "__weakref__")

    def __init__(self, form: str, call: Any, x: Any, out: Any, op: str, algorithm: str,
                 comm_arg: Any, options: Any, where: Any, xkind: Kind, okind: Kind) -> None:
        self.form, self.op, self.algorithm, self.comm_arg = form, op, algorithm, comm_arg
        self.x, self.out = weakref.ref(x), weakref.ref(out)  # never keeps the arrays alive
        self.options, self.opts, self.where = options, call.opts, where
        self.inplace = call.dst is call.src
        # x is written too where the call runs in place: then its write flag counts
        self.xprint = xkind.fingerprint if self.inplace else xkind.read
        self.oprint = okind.fingerprint
        self.xseen, self.oseen = self.xprint(x), self.oprint(out)
        # views: kept (tensors), else made from the arrays at each repeat (None); 1-D of a
        # built-in dtype: the arrays themselves
        self.src = unowned(call.src) if xkind.keeps_views else None
        self.dst = self.src if self.inplace else (unowned(call.dst) if okind.keeps_views
                                                  else None)
        self.vector = call.src is x and call.dst is out
        #: both arrays NumPy: :meth:`Repeats.find` compares their fingerprints field by field
        #: (shape, strides, dtype, then the write flag: what ``_NUMPY`` reads, in its order)
        self.numpy = xkind is _NUMPY and okind is _NUMPY
        #: both tensors: the same, in ``_tensor``'s order
        self.torch = xkind is _TORCH and okind is _TORCH
        #: the views of every repeat where they are kept (tensors), else None: made again
        self.pair = (self.src, self.dst) if self.src is not None and self.dst is not None \
            else None

    def views(self, x: Any, out: Any) -> tuple[Any, Any]:
        """The flat views a repeat on ``x`` and ``out`` runs on."""
        if self.vector:
            return x, out
        src = self.src if self.src is not None else flat(x)
        if self.inplace:
            return src, src
        return src, self.dst if self.dst is not None else flat(out)


class _Nothing:
    """The entry of no call: the most recent one before any is remembered (so that
    :meth:`Repeats.find` reads the most recent entry without asking whether there is one)."""

    __slots__ = ()
    op = algorithm = comm_arg = form = object()  # no argument is this object

    def x(self) -> object:
        return _Nothing.op

    out = x


_NOTHING = _Nothing()


#: the types of op and algorithm arguments looked up by value (names; a message's tag and peer)
_KEYED = (str, int)


class Repeats:
    """The remembered calls (see the module docstring): :meth:`find`, :meth:`remember`."""

    #: entries kept, the least recently used dropped first
    SIZE = 32
    #: entries compared by identity before the keyed lookup: a loop of a few calls builds no key
    RECENT = 4

    def __init__(self) -> None:
        self.entries: dict[tuple, Repeat] = {}  # least recently used first
        # the last entries used, most recent first; never empty: at first the entry of no call
        self.recent: list[Any] = [_NOTHING]

    def find(self, form: str, x: Any, out: Any, op: Any, algorithm: Any, comm: Any,
             options: Any) -> Any:
        """The remembered ``form`` call of these arguments if it may repeat (nothing that
        could change in place has, and the same ``options=`` argument), else None. The recent
        entries are compared by identity, names included (a loop's literals); the keyed lookup
        compares names by value and makes the entry found the most recent."""
        e = self.recent[0]  # a training loop's call: the most recent entry (or NOTHING)
        if not (e.out() is out and e.x() is x and e.op is op and e.algorithm is algorithm
                and e.comm_arg is comm and e.form is form):
            for e in self.recent:  # a loop of a few calls (send, recv): the other recent ones
                if (e.out() is out and e.x() is x and e.op is op and e.algorithm is algorithm
                        and e.comm_arg is comm and e.form is form):
                    break
            else:
                e = self._lookup(form, x, out, op, algorithm, comm)
                if e is None:
                    return None
        # the one "nothing changed" check (the module docstring), in line: every repeat runs
        # it; None is what the weak reference of a gone array gives
        if not (e.options is options and x is not None and out is not None and e.where.live):
            return None
        if e.numpy:  # NumPy's fingerprint compared field by field, without building it
            xs, os = e.xseen, e.oseen
            if (x.shape == xs[0] and x.strides == xs[1] and x.dtype is xs[2]
                    and (not e.inplace or x.flags.writeable)
                    and (out is x or (out.shape == os[0] and out.strides == os[1]
                                      and out.dtype is os[2] and out.flags.writeable))):
                return e
            return None
        if e.torch:  # a tensor's fingerprint (``_tensor``) field by field, likewise
            xs, os = e.xseen, e.oseen
            if (x.data_ptr() == xs[0] and x.shape == xs[1]
                    and (x.is_contiguous() or x.stride()) == xs[2]
                    and x.dtype is xs[3] and x.requires_grad is xs[4]
                    and (out is x or (out.data_ptr() == os[0] and out.shape == os[1]
                                      and (out.is_contiguous() or out.stride()) == os[2]
                                      and out.dtype is os[3] and out.requires_grad is os[4]))):
                return e
            return None
        if e.xprint(x) == e.xseen and (out is x or e.oprint(out) == e.oseen):
            return e
        return None

    def _lookup(self, form: str, x: Any, out: Any, op: Any, algorithm: Any,
                comm: Any) -> Repeat | None:
        """The entry of these arguments by key (which makes it the most recent), or None."""
        if out is None or x is None:  # a gone array's weak reference gives None
            return None
        if type(op) not in _KEYED or type(algorithm) not in _KEYED:
            return None
        key = (form, id(x), id(out), op, algorithm, id(comm))
        e = self.entries.get(key)
        if e is None or e.x() is not x or e.out() is not out:
            return None
        self._use(key, e)
        return e

    def remember(self, entry: Repeat) -> None:
        """Keep ``entry`` as the most recent, in place of any of the same arguments."""
        x, out = entry.x(), entry.out()
        key = (entry.form, id(x), id(out), entry.op, entry.algorithm, id(entry.comm_arg))
        entries = self.entries
        try:  # another thread may be at it too
            # entries of a freed or reset communicator never repeat: dropped, so that what
            # they hold (a context, a lane and its team) is not kept alive
            for k in [k for k, e in entries.items() if not e.where.live]:
                entries.pop(k, None)
            if key not in entries and len(entries) >= self.SIZE:  # the least recently used
                entries.pop(next(iter(entries)), None)
        except (RuntimeError, StopIteration):
            pass
        self._use(key, entry)

    def _use(self, key: tuple, entry: Repeat) -> None:
        """Make ``entry`` the most recently used: last among the entries, first among the
        recent ones, dropping any other of the same arguments (new options: that one is stale);
        a new list, as other threads may be reading."""
        entries = self.entries
        entries.pop(key, None)
        entries[key] = entry
        x, out = entry.x(), entry.out()
        self.recent = [entry, *(e for e in self.recent if not (
            e.x() is x and e.out() is out and e.op == entry.op and e.form is entry.form
            and e.algorithm == entry.algorithm and e.comm_arg is entry.comm_arg))][:self.RECENT]


#: the process's one cache of remembered calls
REPEATS = Repeats()
