"""The Docker engine side of ``docker variant pull`` and ``push``."""

from docker_variant.docker.engine import Engine, EngineError, engine_host
from docker_variant.docker.ops import PullResult, check_push_labels, pull_candidate, push_image
from docker_variant.docker.progress import BuildProgress, LayerProgress

__all__ = [
    "BuildProgress",
    "Engine",
    "EngineError",
    "LayerProgress",
    "PullResult",
    "check_push_labels",
    "engine_host",
    "pull_candidate",
    "push_image",
]
