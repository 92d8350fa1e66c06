"""Catalogs: GPUs and models as shipped (``catalogs/*.yaml``), Hugging Face configs, price lists."""

from planner.catalog.store import (
                                   Catalog,
                                   UnknownName,
                                   catalog_dir,
                                   get_gpu,
                                   get_model,
                                   gpus,
                                   gpus_overlaid,
                                   models,
                                   normalize_name,
)

__all__ = ["Catalog", "UnknownName", "catalog_dir", "get_gpu", "get_model", "gpus", "gpus_overlaid",
           "models", "normalize_name"]
