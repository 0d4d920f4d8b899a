"""The fuzz suite needs hypothesis (the dev extra); without it the suite is skipped, not broken."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("hypothesis") else ["test_*.py"]
