"""``variant-proxy``: an OCI distribution pass-through proxy with the ``_variants`` extension
(docs/reference/proxy-api.md). ``create_app`` builds the ASGI app; ``__main__`` runs it under
uvicorn. ``create_app`` is imported when first asked for, so that ``variant-proxy --help``
loads neither Starlette nor httpx."""

from docker_variant.lazy import lazy_attributes

__all__ = ["create_app"]

__getattr__ = lazy_attributes(__name__, {"create_app": "app"})
