"""How a measured CPU rank's memory allocator treats freed memory: the harness's allocator policy.

A GPU framework's caching allocator keeps the device memory a freed tensor held and hands it to the next tensor
of that size, so an iteration in steady state allocates no new memory. On a CPU, torch allocates through the C
library (c10's alloc_cpu: posix_memalign), and glibc's malloc serves a large request with a fresh mmap (above
M_MMAP_THRESHOLD: 128 KiB at start, raised dynamically up to 32 MiB on 64-bit hosts) and unmaps it on free, and
trims free memory at the top of its heap back to the kernel (above M_TRIM_THRESHOLD): every iteration then
faults the pages of its large temporaries in again (the sparse gradients of the lookups' backward, the pooled
embeddings, the all-to-all buffers), a cost the GPU it stands for never pays, and one that varies with the
allocator's state from run to run (mallopt(3), glibc 2.36 malloc/malloc.c).

Policies (applied in the rank before torch loads; `trainsim measure --allocator`):
  keep    no mmap for large requests (M_MMAP_MAX = 0) and no trimming (M_TRIM_THRESHOLD = -1): freed memory
          stays in the process's heap and is reused, as a caching allocator does (the harness's default)
  system  the C library's defaults, untouched (glibc's MALLOC_* environment variables then apply as usual)
"""

import ctypes
import ctypes.util
from collections.abc import Callable

from trainsim.errors import ConfigError

# mallopt(3) parameter numbers, glibc malloc/malloc.h (2.36)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

POLICIES: dict[str, tuple[tuple[int, int], ...]] = {
    "keep": ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1)),
    "system": (),
}
DEFAULT_POLICY = "keep"


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise ConfigError("allocator", name, f"choose one of {', '.join(POLICIES)}")
    return name


def apply_policy(name: str, mallopt: Callable[[int, int], int] | None = None) -> bool:
    """Set the policy's mallopt parameters in this process; True when every one was accepted (or there were none),
    False where the C library has no mallopt (not glibc) or refused one. mallopt: the C function (a stand-in in
    tests); looked up in the process's C library when not given."""
    settings = POLICIES[check_policy(name)]
    if not settings:
        return True
    function = mallopt if mallopt is not None else _libc_mallopt()
    if function is None:
        return False
    return all(function(parameter, value) == 1 for parameter, value in settings)  # mallopt returns 1 on success


def _libc_mallopt() -> Callable[[int, int], int] | None:
    path = ctypes.util.find_library("c")
    function = getattr(ctypes.CDLL(path), "mallopt", None) if path else None
    if function is None:
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int)
    function.restype = ctypes.c_int
    return function
