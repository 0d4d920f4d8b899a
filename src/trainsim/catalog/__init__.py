"""Built-in data: models, devices, links, clusters, and the fitted calibration. Loaded into frozen specs."""

from trainsim.catalog.loader import (
    list_clusters,
    list_devices,
    list_links,
    list_models,
    load_cluster,
    load_device,
    load_link,
    load_model,
)

__all__ = [
    "list_clusters", "list_devices", "list_links", "list_models",
    "load_cluster", "load_device", "load_link", "load_model",
]
