"""The pure planner: where a gang goes, or why not (no SQL, no HTTP). ``variant-scheduler``
plans on the pool its agents' heartbeats build, ``docker-variant k8s gang`` on the one a
cluster's ResourceSlices build; both by the same rule. Imports only point down: this
package sits below ``scheduler`` and ``k8s``.

| module | job |
|---|---|
| ``placement.py`` | the judge and the search: where a gang goes, or why not |
| ``pool.py`` | the pool index: nodes, devices and what they have in use |
| ``kept.py`` | the last few values by key, for what repeated plans would work out again |
"""
