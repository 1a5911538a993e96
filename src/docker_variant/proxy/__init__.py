"""``variant-proxy``: an OCI distribution pass-through proxy with the ``_variants`` extension
(docs/reference/proxy-api.md). ``create_app`` builds the ASGI app; ``__main__`` runs it under uvicorn."""

from docker_variant.proxy.app import create_app

__all__ = ["create_app"]
