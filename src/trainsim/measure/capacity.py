"""Whether a job's ranks fit in this machine's memory, checked before any rank starts (a job that does not fit
would draw the kernel's OOM killer onto the host, not fail with a message)."""

import os
from pathlib import Path

from trainsim.errors import ConfigError

_GIB = 2**30


def host_available_bytes() -> float:
    """Memory the host can give new processes: MemAvailable of /proc/meminfo (Linux), else the physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def gpu_memory_bytes(count: int) -> list[float]:
    """Total memory of the first `count` CUDA devices."""
    import torch

    return [float(torch.cuda.get_device_properties(i).total_memory) for i in range(count)]


def check_fits(per_rank_bytes: float, ranks: int, device: str) -> None:
    """Refuse a job whose predicted peak per rank exceeds a GPU's memory, or whose ranks together (on a CPU)
    exceed the host's available memory; the message carries the numbers."""
    if device == "cuda":
        smallest = min(gpu_memory_bytes(ranks))
        if per_rank_bytes > smallest:
            raise ConfigError.across_fields("measure", f"the job needs {per_rank_bytes / _GIB:.1f} GiB per rank "
                                            f"(predicted peak) and this machine's GPUs have {smallest / _GIB:.1f} GiB")
        return
    available = host_available_bytes()
    total = per_rank_bytes * ranks
    if total > available:
        raise ConfigError.across_fields("measure", f"the job's {ranks} ranks need {total / _GIB:.1f} GiB together "
                                        f"({per_rank_bytes / _GIB:.1f} GiB each, predicted peak) and this machine "
                                        f"has {available / _GIB:.1f} GiB available")
