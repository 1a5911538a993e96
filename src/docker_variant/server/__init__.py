"""Plumbing shared by the two servers, ``variant-proxy`` and ``variant-scheduler``, one job
per module (nothing is imported here, so a server loads only the pieces it uses):

- ``errors``: the OCI error body both answer with, and short failure kinds for metrics;
- ``bodies``: request bodies read with a size bound (``oci.bodies``);
- ``auth``: the bearer token of a request;
- ``options``: the shared command-line options (listen address, TLS, durations, log level)
  and one-line argument errors (exit 2);
- ``net``: listen addresses, loopback test and a pre-bound socket (a busy port is told
  before start-up);
- ``logs``: JSON log lines;
- ``serve``: how both servers start: one uvicorn configuration, the bound socket, the
  start-up log line, a clean stop.
"""
