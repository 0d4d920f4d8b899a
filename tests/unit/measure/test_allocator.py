"""The measured ranks' malloc policy (measure.allocator): which mallopt parameters each policy sets, and, on
glibc, that "keep" stops a freed large buffer from faulting its pages in again where the C library's defaults
(an mmap per large request, unmapped on free) do not."""

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from trainsim.errors import ConfigError
from trainsim.measure.allocator import M_MMAP_MAX, M_TRIM_THRESHOLD, apply_policy, check_policy


def test_keep_disables_mmap_and_trimming() -> None:
    calls: list[tuple[int, int]] = []
    assert apply_policy("keep", lambda parameter, value: calls.append((parameter, value)) or 1)
    assert calls == [(M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1)] == [(-4, 0), (-1, -1)]  # glibc malloc.h


def test_system_touches_nothing_and_a_refusal_is_reported() -> None:
    calls: list[tuple[int, int]] = []
    assert apply_policy("system", lambda parameter, value: calls.append((parameter, value)) or 1)
    assert calls == []
    assert not apply_policy("keep", lambda parameter, value: 0)  # mallopt returns 0 when it refuses


def test_an_unknown_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="allocator='tcmalloc' is invalid: choose one of keep, system"):
        check_policy("tcmalloc")


# A child process (mallopt changes the process for good): a 64 MiB buffer (above glibc's largest dynamic mmap
# threshold, 32 MiB) written, freed and written again; prints the minor faults of the second write.
_REFAULTS = """
import resource, sys
from trainsim.measure.allocator import apply_policy
assert apply_policy(sys.argv[1])
def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
first = b"\\x01" * (64 * 1024 * 1024)
del first
before = faults()
second = b"\\x02" * (64 * 1024 * 1024)
print(faults() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policies name glibc's mallopt parameters")
def test_keep_reuses_a_freed_buffer_where_the_system_default_faults_it_in_again() -> None:
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    page_bytes = 2 * 1024 * 1024 if thp.exists() and "[always]" in thp.read_text() else 4096
    pages = 64 * 1024 * 1024 // page_bytes
    refaults = {policy: int(subprocess.run([sys.executable, "-c", _REFAULTS, policy], capture_output=True,
                                           text=True, check=True).stdout) for policy in ("system", "keep")}
    assert refaults["system"] >= pages  # a fresh mmap: every page faulted in again
    assert refaults["keep"] < pages // 100  # the freed heap memory reused
