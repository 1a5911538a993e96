"""``variant-scheduler``: the agent-device variant registry and matcher (SPEC section 8).

Agents report their host's and each device's supported lists; a placement puts one variant
of an image on a gang of nodes whose devices all fit it (``placement.py``, on top of
``select``), all or nothing, with no device ever allocated twice (``store.py``: a primary key
per allocated device). ``app.py`` is the HTTP API; ``__main__`` runs it under uvicorn.
"""

from docker_variant.scheduler.app import create_app
from docker_variant.scheduler.placement import Plan, Pool, Refusal, build_pool, plan
from docker_variant.scheduler.store import Store

__all__ = ["Plan", "Pool", "Refusal", "Store", "build_pool", "create_app", "plan"]
