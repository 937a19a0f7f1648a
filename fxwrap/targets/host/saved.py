"""The loader a saved program's host kernels carry: their shared object, as bytes.

``program.save`` replaces the loader of each C++ kernel (``cpu``) and Metal-shim kernel
(``mps_shim``) with a ``SharedObjectLoader`` holding the ``.so`` the launcher was
built from; ``fxwrap.load`` then runs it without a compiler::

    SharedObjectLoader(binary=b"\\x7fELF...", host="x86_64\\nmodel name: ...",
                       bind=bind_c_kernel, rebuild=kernel_loader)
    loader(kernel)   # writes FXWRAP_CACHE_DIR/saved/3f/3f2a...e1.so (once), dlopens it,
                     # and binds the kernel's symbol: a launcher, no compile

The binary was built with ``-march=native`` for the host that saved it: on another
host (a different ``host_fingerprint()``), or when the file cannot be loaded, the
kernel is compiled again from its source (``rebuild``) with a warning.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path

from fxwrap.targets.host.cache import default_cache_dir, write_atomically
from fxwrap.targets.host.compiler import host_fingerprint
from fxwrap.targets.host.loader import SHARED_SYMBOL, c_function, load_library, make_launcher, shared_source


def saved_binary_path(binary: bytes) -> Path:
    """Where a saved shared object is written to be dlopened: by the hash of its bytes,
    under ``FXWRAP_CACHE_DIR/saved`` (atomically; processes loading the same file share it)."""
    digest = hashlib.sha256(binary).hexdigest()
    path = default_cache_dir() / "saved" / digest[:2] / f"{digest}.so"
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest:  # untrusted: its bytes checked
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, binary)
    return path


_BINARIES: dict[tuple, bytes] = {}  # (device, inode, mtime, size) -> the file's bytes, the last few files


def _binary(library: str | os.PathLike) -> bytes:
    """The bytes of the file at ``library``, one object per file (by device and inode, not
    path): kernels of one translation unit share its shared object (hard links of one file),
    which a program file's pickle then stores once."""
    status = os.stat(library)
    file_id = (status.st_dev, status.st_ino, status.st_mtime_ns, status.st_size)
    binary = _BINARIES.get(file_id)
    if binary is None:
        binary = Path(library).read_bytes()
        while len(_BINARIES) >= 64:
            _BINARIES.pop(next(iter(_BINARIES)), None)
        _BINARIES[file_id] = binary
    return binary


class SharedObjectLoader:
    """A kernel loader carrying the kernel's shared object (see the module docstring):
    ``bind(library_path, kernel) -> launcher`` binds it, ``rebuild(kernel) -> launcher``
    compiles the kernel's source instead (another host, or a file that does not load)."""

    fxwrap_saved = True  # a saved loader: program files store it as it is

    def __init__(self, binary: bytes, host: str, bind: Callable, rebuild: Callable):
        self.binary, self.host, self.bind, self.rebuild = binary, host, bind, rebuild

    @classmethod
    def of(cls, library: str | os.PathLike, bind: Callable, rebuild: Callable) -> "SharedObjectLoader":
        """The loader of the shared object at ``library``, built on this host."""
        return cls(_binary(library), host_fingerprint(), bind, rebuild)

    def __call__(self, kernel) -> Callable:
        if self.host != host_fingerprint():
            warnings.warn(f"fxwrap: kernel {kernel.name} (target {kernel.target}) of a loaded program was "
                          "built for another CPU (-march=native); compiling it again from its source",
                          stacklevel=2)
            return self.rebuild(kernel)
        try:
            return self.bind(saved_binary_path(self.binary), kernel)
        except OSError as exc:
            warnings.warn(f"fxwrap: the saved binary of kernel {kernel.name} (target {kernel.target}) "
                          f"does not load ({exc}); compiling it again from its source", stacklevel=2)
            return self.rebuild(kernel)

    def __repr__(self) -> str:
        return f"SharedObjectLoader({len(self.binary)} bytes, bind={self.bind.__name__})"


def bind_c_kernel(library: Path, kernel) -> Callable:
    """A C++ kernel's launcher from its shared object: the symbol ``loader.launcher_for``
    binds (named by the kernel's code: ``loader.shared_source``), or in a file saved before
    that ``SHARED_SYMBOL``, or before kernels shared objects the kernel's own symbol."""
    launch = kernel.launch
    lib = load_library(library)
    source = getattr(kernel, "source", None)
    named = shared_source(source, launch.symbol)[1] if source is not None else launch.symbol
    symbol = next((s for s in (named, SHARED_SYMBOL) if hasattr(lib, s)), launch.symbol)
    fn = c_function(lib, symbol, launch.pointers, len(launch.size_symbols))
    launcher = make_launcher(fn, launch.pointers, len(launch.size_symbols), name=launch.symbol)
    launcher.library = str(library)
    return launcher
