"""Where the profile database lives by default (apart from the database module, which loads sqlite3: a prediction
names the default path, in its help and its engines, without reading the database)."""

import os
from pathlib import Path

DB_FILE_NAME = "profile.sqlite"


def default_db_path() -> Path:
    """$XDG_CACHE_HOME/trainsim/profile.sqlite, else ~/.cache/trainsim/profile.sqlite."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "trainsim" / DB_FILE_NAME
