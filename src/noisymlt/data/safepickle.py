"""Reading published pickles without running their code: an unpickler that rebuilds numpy arrays and nothing else.

Unpickling calls whatever globals the file names (``os.system`` as easily as ``numpy.ndarray``), so a pickle
fetched from the web is read with an allow-list: numpy's array reconstruction, dtypes, numpy scalars and the
``_codecs.encode`` that protocol 2 uses for bytes. Dicts, lists, tuples, strings and numbers need no global (the
pickle opcodes build them). Any other global is refused before it is called, with one line naming the file and
the global. Used for ML-GCN's GloVe arrays (noisymlt.data.glove) and [CL]'s noisy-label dicts
(noisymlt.data.authors_noise).
"""

from __future__ import annotations

import io
import pickle
from functools import cache

import numpy as np

from noisymlt.errors import NoisyMLTError, cause


def _empty_bytes(*args) -> bytes:
    """bytes() as an empty array's pickle calls it; any argument (bytes(10**12) would fill memory) is refused."""
    if args:
        raise pickle.UnpicklingError("bytes() with arguments is not allowed")
    return b""


@cache
def allowed_globals() -> dict[tuple[str, str], object]:
    """The only callables a pickle of numpy arrays needs, under numpy 1.x and 2.x module names."""
    import codecs

    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    allowed: dict[tuple[str, str], object] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
                                              ("_codecs", "encode"): codecs.encode}
    for mod in ("__builtin__", "builtins"):  # protocol 2 writes an empty array's data as bytes()
        allowed[(mod, "bytes")] = _empty_bytes
    for mod in ("numpy.core", "numpy._core"):
        allowed[(f"{mod}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{mod}.multiarray", "scalar")] = multiarray.scalar
        allowed[(f"{mod}.numeric", "_frombuffer")] = numeric._frombuffer
    return allowed


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle names a global outside the allow-list; it was not looked up, let alone called."""

    def __init__(self, module: str, name: str):
        super().__init__(f"global {module}.{name} is not allowed")
        self.qualname = f"{module}.{name}"


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        allowed = allowed_globals()
        if (module, name) not in allowed:
            raise RefusedGlobal(module, name)
        return allowed[(module, name)]


def load_pickle(data: bytes, source: str = "pickle") -> object:
    """Unpickle ``data`` (a file's bytes) allowing only numpy arrays inside plain containers. A refused global or
    damaged bytes raise one NoisyMLTError line naming ``source``; nothing in the file runs."""
    try:
        # latin1: numpy arrays pickled under Python 2 keep their raw bytes in str objects
        return _ArrayUnpickler(io.BytesIO(data), encoding="latin1").load()
    except RefusedGlobal as exc:
        raise NoisyMLTError(f"{source}: refused to unpickle: global {exc.qualname} is not allowed (only numpy "
                            "arrays, dtypes and plain containers are; nothing in the file was run)") from exc
    except Exception as exc:  # UnpicklingError, EOFError, ValueError, ... on bad or hostile bytes
        raise NoisyMLTError(f"{source}: not a readable pickle ({cause(exc, 200)})") from exc


def load_array_pickle(data: bytes, source: str = "pickle") -> np.ndarray:
    """Unpickle ``data`` that must hold one numpy array, refusing any other global (no code runs)."""
    obj = load_pickle(data, source)
    if not isinstance(obj, np.ndarray):
        raise NoisyMLTError(f"{source}: pickle holds {type(obj).__name__}, expected a numpy array")
    return obj
