"""Read YAML/JSON files into plain data, with one-line errors.

Every file a user names is read through `read_text`: a regular file (not a device, a FIFO or a folder) of at
most a size cap, decoded as UTF-8, and a YAML file is checked for its nesting and the size its aliases expand
to before it is built, so no input (`/dev/zero`, a billion-laughs YAML, 2,000 nested brackets) can take
unbounded time or memory. Error messages name the file, never its content.
"""

import json
import math
import os
import stat
import tempfile
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from trainsim.errors import InputFileError

DATA_DIR = Path(__file__).parent / "data"
# libyaml's parser where PyYAML was built with it: the same data (the same safe constructor and resolver) in
# a tenth of the time of the pure-Python parser, which matters as predict reads the whole catalog.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# A model, cluster, job or strategy-tree file is a few KiB; the largest HF config.json is about 10 KiB.
MAX_MAPPING_FILE_BYTES = 4 * 2**20
# Nesting of YAML/JSON collections (the files trainsim reads nest four deep at most) and nodes after YAML alias
# expansion (the largest catalog file has about 2,000).
MAX_NESTING = 64
MAX_YAML_NODES = 200_000
_SHOWN_PATH_CHARS = 100


def shown_path(path: Path | str) -> str:
    """A path as error messages show it: a long one cut from the left, so its file name stays."""
    text = str(path)
    return text if len(text) <= _SHOWN_PATH_CHARS else "..." + text[-(_SHOWN_PATH_CHARS - 3):]


def read_text(path: Path, max_bytes: int = MAX_MAPPING_FILE_BYTES, gunzip: bool = False) -> str:
    """The UTF-8 text of a regular file of at most max_bytes; anything else is an InputFileError naming the file.
    gunzip: the file is gzip-compressed and max_bytes bounds both the file and its decompressed text (a small
    file that inflates to gigabytes is refused after max_bytes)."""
    name = shown_path(path)
    data = _read_capped(path, name, max_bytes)
    if gunzip:
        data = _gunzip(data, name, max_bytes)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{name} is not UTF-8 text (byte {exc.start} is not valid UTF-8)") from None


def _read_capped(path: Path, name: str, max_bytes: int) -> bytes:
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"{name} is not a regular file")
        if info.st_size > max_bytes:
            raise InputFileError(f"{name} holds {info.st_size} bytes, more than the {max_bytes} allowed")
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise InputFileError(f"cannot read {name}: {exc.strerror or type(exc).__name__}") from None
    if len(data) > max_bytes:
        raise InputFileError(f"{name} holds more than the {max_bytes} bytes allowed")
    return data


def _gunzip(data: bytes, name: str, max_bytes: int) -> bytes:
    """The decompressed bytes of a gzip file (one or more members), at most max_bytes of them."""
    out: list[bytes] = []
    size = 0
    try:
        while data:
            inflater = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer
            out.append(inflater.decompress(data, max_bytes + 1 - size))
            size += len(out[-1])
            if size > max_bytes or inflater.unconsumed_tail:
                raise InputFileError(f"{name} decompresses to more than the {max_bytes} bytes allowed")
            if not inflater.eof:
                raise InputFileError(f"{name} is not a complete gzip file")
            data = inflater.unused_data
    except zlib.error as exc:
        raise InputFileError(f"{name} is not a valid gzip file ({exc})") from None
    return b"".join(out)


def _check_yaml_shape(text: str) -> None:
    """Refuse, before building anything, YAML nested deeper than MAX_NESTING or whose aliases expand past
    MAX_YAML_NODES (one pass over the parser's events, counting each alias as the nodes it repeats)."""
    anchored: dict[str, int] = {}
    open_nodes: list[list[Any]] = []  # [anchor, nodes so far] of each collection being read
    total = 0
    for event in yaml.parse(text, Loader=_FAST_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_nodes) >= MAX_NESTING:
                raise ValueError(f"nests deeper than {MAX_NESTING} levels")
            open_nodes.append([event.anchor, 1])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, nodes = open_nodes.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, nodes = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            if str(event.anchor) not in anchored:  # a node holding itself: an endless structure
                raise ValueError(f"the alias *{str(event.anchor)[:40]} refers to no finished anchor (undefined, or "
                                 "a node that contains it)")
            anchor, nodes = None, anchored[str(event.anchor)]
        else:
            continue
        if anchor is not None:
            anchored[str(anchor)] = nodes
        if open_nodes:
            open_nodes[-1][1] += nodes
        total += nodes if not open_nodes else 0
        if nodes > MAX_YAML_NODES or total > MAX_YAML_NODES:
            raise ValueError(f"expands to more than {MAX_YAML_NODES} nodes (aliases repeat anchored nodes)")


def _load_yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_FAST_LOADER)
    except yaml.YAMLError:
        return yaml.safe_load(text)  # NB: the pure-Python parser's error message, the one users have seen


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _first_problem(data: Any) -> str | None:
    """What is wrong with parsed data, or None: the key path of the first NaN or infinite number, or a nesting
    deeper than MAX_NESTING (JSON has no nesting bound of its own short of the recursion limit)."""
    stack: list[tuple[str, Any, int]] = [("", data, 0)]
    while stack:
        path, value, depth = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return f"{path or '(top level)'} is not a finite number (NaN and infinity are not allowed)"
        if depth > MAX_NESTING:
            return f"{path[:60]} nests deeper than {MAX_NESTING} levels"
        if isinstance(value, dict):
            stack += [(f"{path}.{key}" if path else str(key), item, depth + 1) for key, item in value.items()]
        elif isinstance(value, list):
            stack += [(f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value)]
    return None


def parse_text(text: str, is_json: bool, name: str, check_shape: bool = True) -> Any:
    """Parse JSON or YAML text; every problem (syntax, nesting, alias expansion, an integer past Python's digit
    limit, NaN or Infinity) is one InputFileError line naming `name`. check_shape=False skips the YAML event pass
    (for the catalog's own files, which ship with trainsim: start-up)."""
    kind = "JSON" if is_json else "YAML"
    try:
        if is_json:
            data = json.loads(text, parse_constant=_refuse_constant)
        else:
            if check_shape:
                _check_yaml_shape(text)
            data = _load_yaml(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{name} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
    except yaml.YAMLError as exc:
        raise InputFileError(f"{name} is not valid YAML{_where(exc)}: {_problem(exc)}") from None
    except RecursionError:
        raise InputFileError(f"{name} is not valid {kind}: nests deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:  # nesting, alias expansion, NaN in JSON, 5,000-digit integers
        raise InputFileError(f"{name} is not valid {kind}: {str(exc).splitlines()[0]}") from None
    problem = _first_problem(data)
    if problem is not None:
        raise InputFileError(f"{name}: {problem}")
    return data


def read_mapping(path: Path, max_bytes: int = MAX_MAPPING_FILE_BYTES) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level is a mapping."""
    name = shown_path(path)
    data = parse_text(read_text(path, max_bytes), path.suffix == ".json", name,
                      check_shape=path.parent.parent != DATA_DIR and path.parent != DATA_DIR)
    if not isinstance(data, dict):
        raise InputFileError(f"{name} must hold a mapping at the top level, found {type(data).__name__}")
    return data


def read_entry_list(path: Path, what: str) -> list[dict[str, Any]]:
    """A measurement file that `trainsim profile` keeps: a YAML list of mappings (`what` words one entry for the
    error), or no entries where the file does not exist yet."""
    if not path.exists():
        return []
    name = shown_path(path)
    data = parse_text(read_text(path), False, name) or []
    if not isinstance(data, list) or not all(isinstance(entry, dict) for entry in data):
        raise InputFileError(f"{name} must hold a list of {what} entries")
    return data


def store_entry(path: Path, entries: list[dict[str, Any]], entry: dict[str, Any], key: tuple[str, ...],
                header: str) -> None:
    """Write `entries` with `entry` added, replacing the one with the same values at `key`, sorted by `key`,
    atomically, under a one-line `header` comment."""
    kept = [e for e in entries if tuple(e[k] for k in key) != tuple(entry[k] for k in key)]
    kept.append(entry)
    kept.sort(key=lambda e: tuple(e[k] for k in key))
    write_atomic(path, f"# {header}\n" + yaml.safe_dump(kept, sort_keys=False))


def write_atomic(path: Path, text: str) -> None:
    """Write a text file whole or not at all (a temporary file in the same folder, then a rename), so a reader
    never sees half a file and a failed write leaves any earlier file as it was."""
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name[:40]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates it private; what we write is an ordinary output file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _where(exc: yaml.YAMLError) -> str:
    """Where a YAML error is (1-based, as editors count), or nothing where PyYAML gives no place."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def _problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    text = " ".join(part for part in (context, problem) if part) or (str(exc).splitlines() or [type(exc).__name__])[0]
    return text


def key_lines(path: Path) -> dict[str, int]:
    """The 1-based line of each key of a YAML mapping file, top level and one level down (`strategy.tp` is
    also listed as `tp`); {} for JSON or where the file does not parse."""
    if path.suffix == ".json":
        return {}
    try:
        root = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    lines: dict[str, int] = {}
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            lines.setdefault(str(key.value), key.start_mark.line + 1)
            if isinstance(value, yaml.MappingNode):
                for inner, _ in value.value:
                    lines.setdefault(str(inner.value), inner.start_mark.line + 1)
    return lines


def catalog_files(folder: str) -> list[Path]:
    """The data files of one catalog folder, in the order their entries are read (a later entry of the same
    name wins)."""
    return sorted((DATA_DIR / folder).glob("*.yaml"))


def file_entries(path: Path, key: str) -> list[dict[str, Any]]:
    """The entries under `key` in one catalog data file, each with the file's `defaults` under it."""
    data = read_mapping(path)
    defaults = data.get("defaults", {})
    return [{**defaults, **entry} for entry in data.get(key, [])]


def catalog_entries(folder: str, key: str) -> list[dict[str, Any]]:
    """All entries under `key` in the data files of one catalog folder; each file may set `defaults`."""
    return [entry for path in catalog_files(folder) for entry in file_entries(path, key)]


def files_naming(folder: str, name: str) -> list[Path]:
    """The data files of a catalog folder whose text holds `name` (case-folded): the only ones that can define an
    entry of that name, so a lookup parses them alone (start-up: `trainsim predict` reads one model file of
    twelve, not the CNN files of thousands of YAML nodes)."""
    wanted = name.casefold()
    return [path for path in catalog_files(folder) if wanted in _folded_text(path)]


@cache
def _folded_text(path: Path) -> str:
    """A catalog file's text, case-folded, read once per process (as the loader parses each file once)."""
    return read_text(path).casefold()
