"""The node agent (``variant-scheduler agent``): a client of the scheduler, on top of
``providers``, that keeps this node's report current.

One job per module; nothing is imported here, so the scheduler's command line can take the
agent's options without loading the providers:

- ``client``: talking to a scheduler (its base URL, the bearer token file, the HTTP client);
- ``inputs``: the providers files the agent takes (lists, or a report with capacity);
- ``health``: NVML's verdicts on the NVIDIA GPUs;
- ``node``: the agent itself: detect, judge, report, again and again;
- ``command``: the ``agent`` subcommand's options and its run.
"""

#: Seconds between heartbeats unless ``--interval`` says otherwise.
DEFAULT_INTERVAL_S = 10.0
