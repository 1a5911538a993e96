"""The wire shapes that the node agent and the scheduler both speak, so that a node agent
never loads the scheduler's server to check what it sends:

- ``names``: the rule for every name a heartbeat or a request carries.
"""
