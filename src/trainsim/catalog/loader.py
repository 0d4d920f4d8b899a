"""Name -> spec lookups over the shipped data files, plus custom files given by path."""

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from trainsim.catalog.file_errors import file_error
from trainsim.catalog.files import DATA_DIR, catalog_files, file_entries, files_naming, read_mapping
from trainsim.catalog.hf_config import model_from_file
from trainsim.catalog.model_files import parse_model
from trainsim.catalog.runtime_memory import measured_runtime_bytes
from trainsim.errors import UnknownNameError
from trainsim.hardware.cluster import ClusterSpec, LinkSpec
from trainsim.hardware.device import DeviceSpec
from trainsim.ir.model_spec import ModelSpec

T = TypeVar("T")


# Each table is read file by file (a file's entries parsed once); a lookup by name parses only the files whose
# text holds the name (files.files_naming), and the whole folder when it is not found there (unknown names list
# every entry), so `trainsim predict` parses one model file and one device file, not the whole catalog.
@cache
def _file_models(path: Path) -> dict[str, ModelSpec]:
    return {entry["name"]: parse_model(entry, f"model {entry.get('name')}") for entry in file_entries(path, "models")}


@cache
def _file_devices(path: Path) -> dict[str, DeviceSpec]:
    table: dict[str, DeviceSpec] = {}
    for entry in file_entries(path, "devices"):
        device = DeviceSpec.parse(entry, f"device {entry.get('name')}")
        measured = measured_runtime_bytes(device.name)
        if measured is not None:  # a measured fact of this machine replaces the entry's placeholder
            device = device.model_copy(update={"runtime_reserved_bytes": sum(measured)})
        table[device.name] = device
        for alias in device.aliases:
            table[alias] = device
    return table


@cache
def _file_links(path: Path) -> dict[str, LinkSpec]:
    return {entry["name"]: LinkSpec.parse(entry, f"link {entry.get('name')}") for entry in file_entries(path, "links")}


@cache
def _file_clusters(path: Path) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in file_entries(path, "clusters")}


def _whole(folder: str, per_file: Callable[[Path], dict[str, T]]) -> dict[str, T]:
    table: dict[str, T] = {}
    for path in catalog_files(folder):
        table.update(per_file(path))
    return table


def _named(folder: str, name: str, per_file: Callable[[Path], dict[str, T]],
           key: Callable[[str], str] = str) -> T | None:
    """The entry whose key(name) is key(name) (the last one read, as in the whole table), or None if none is."""
    wanted = key(name)
    found: T | None = None
    for path in files_naming(folder, name):
        for entry_name, value in per_file(path).items():
            if key(entry_name) == wanted:
                found = value
    if found is None:
        found = {key(entry_name): value for entry_name, value in _whole(folder, per_file).items()}.get(wanted)
    return found


def _models() -> dict[str, ModelSpec]:
    return _whole("models", _file_models)


def _devices() -> dict[str, DeviceSpec]:
    return _whole("devices", _file_devices)


def _links() -> dict[str, LinkSpec]:
    return _whole("links", _file_links)


def _cluster_entries() -> dict[str, dict[str, Any]]:
    return _whole("clusters", _file_clusters)


def list_models() -> list[ModelSpec]:
    return list(_models().values())


def list_devices() -> list[DeviceSpec]:
    return list({device.name: device for device in _devices().values()}.values())


def list_links() -> list[LinkSpec]:
    return list(_links().values())


def cluster_names() -> list[str]:
    return list(_cluster_entries())


def list_clusters() -> list[ClusterSpec]:
    return [load_cluster(name) for name in _cluster_entries()]


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name (case-insensitive), a YAML/JSON model file, or a Hugging Face config.json."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json") or _exists(path):
        return model_from_file(path)
    spec = _named("models", name_or_path, _file_models, str.lower)
    if spec is None:
        raise UnknownNameError("model", name_or_path, list(_models()))
    return spec


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to be a path, a NUL byte: not a file, so a catalog name
        return False


def load_device(name: str) -> DeviceSpec:
    device = _named("devices", name, _file_devices)
    if device is None:
        raise UnknownNameError("device", name, [d.name for d in list_devices()])
    return device


def load_link(name: str) -> LinkSpec:
    link = _named("links", name, _file_links)
    if link is None:
        raise UnknownNameError("link", name, list(_links()))
    return link


def cluster_from_mapping(entry: dict[str, Any], where: str = "cluster", path: Path | None = None) -> ClusterSpec:
    """Resolve the device and link names of a cluster entry (inline mappings are accepted too). path: the file
    the entry was read from, whose errors then name every problem with its line."""
    resolved = dict(entry)
    for key, load in (("device", load_device), ("intra_node", load_link), ("inter_node", load_link)):
        if isinstance(entry.get(key), str):
            resolved[key] = load(entry[key])
    if isinstance(entry.get("rank_devices"), dict):  # rank -> a device name (or an inline mapping)
        resolved["rank_devices"] = {rank: load_device(value) if isinstance(value, str) else value
                                    for rank, value in entry["rank_devices"].items()}
    if path is None:
        return ClusterSpec.parse(resolved, where)
    try:
        return ClusterSpec.model_validate(resolved)
    except ValidationError as exc:
        raise file_error(exc, path, "cluster", list(ClusterSpec.model_fields)) from None


# the presets an unknown cluster name's error line names (the catalog holds too many for one line)
_CLUSTER_EXAMPLES = ("dgx-a100-80gb", "dgx-h100-80gb", "dgx-h200", "dgx-b200", "gb200-nvl72", "aws-p5")


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A preset name or a YAML/JSON cluster file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json"):
        return cluster_from_mapping(read_mapping(path), str(path), path)
    entry = _named("clusters", name_or_path, _file_clusters)
    if entry is None:
        raise UnknownNameError("cluster", name_or_path, list(_cluster_entries()), list(_CLUSTER_EXAMPLES),
                               "trainsim hardware")
    return cluster_from_mapping(entry, f"cluster {name_or_path}")


def data_dir() -> Path:
    return DATA_DIR
