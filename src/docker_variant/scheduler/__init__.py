"""``variant-scheduler``: the agent-device variant registry and matcher.

Agents report their host's and each device's supported lists; a placement puts one variant
of an image on a gang of nodes whose devices all fit it, all or nothing, with no device ever
allocated twice. The rooms, top to bottom (imports only point down):

| module | job |
|---|---|
| ``app.py`` | the HTTP API (Starlette); ``__main__`` runs it under uvicorn |
| ``ui.py`` | the fleet view, one HTML page |
| ``whatif.py`` | would new nodes of a template make a request place (pure, on a pool copy) |
| ``store.py`` | the operations: heartbeats, placements, replace, deletes, the agent TTL |
| ``poolcache.py`` | the pools in memory, kept current with the rows by two version numbers |
| ``views.py`` | agents as ``GET /v1/agents`` shows them |
| ``rows.py`` | every SQL statement: the only module that touches the database |
| ``documents.py``, ``tokens.py`` | what agents and clients send, validated; who may call |
| ``models.py``, ``database.py`` | the tables; opening the database |

The pool and the search are the pure planner, in ``docker_variant.planner`` (below this
package: ``k8s gang`` plans with it too).
"""

from docker_variant.lazy import lazy_attributes

TYPE_CHECKING = False  # typing costs ~5 ms at start-up; type checkers read this as True

if TYPE_CHECKING:
    from docker_variant.planner.placement import Plan, Refusal, plan
    from docker_variant.planner.pool import Pool, build_pool
    from docker_variant.scheduler.app import create_app
    from docker_variant.scheduler.store import Store

__all__ = ["Plan", "Pool", "Refusal", "Store", "build_pool", "create_app", "plan"]

# imported on first use: ``variant-scheduler --help`` or ``agent`` loads no server
_own = lazy_attributes(__name__, {"create_app": "app", "Store": "store"})
_planner = lazy_attributes(
    "docker_variant.planner",
    {"Plan": "placement", "Refusal": "placement", "plan": "placement", "Pool": "pool"}
    | {"build_pool": "pool"},
)


def __getattr__(name: str) -> object:
    return _own(name) if name in ("create_app", "Store") else _planner(name)
