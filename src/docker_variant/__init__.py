"""docker-variant: PEP 817/825 variants for container images and schedulers.

The package map, bottom first. Each layer imports only its own layer and those below it
(``tests/test_layers.py`` keeps it so):

- base rules every layer may use: ``errors`` (one exception tree, each error with its exit
  code), ``numtext``, ``jsondoc`` and ``tomldoc`` (bounded readers of untrusted numbers, JSON
  and TOML, sharing ``textdoc``), ``safetext`` (untrusted text made safe to print), ``retry`` (jittered backoff), ``lazy`` (package attributes imported on first use), ``pluginmeta`` (the Docker CLI plugin's metadata),
  ``localcache``, ``openapi`` (the servers' API documents), and the pure wire rules of
  ``oci``: ``oci.grammar``, ``oci.mediatypes``, ``oci.errcode``, ``oci.bodies`` (the one
  bounded body reader)
- ``vendors``   one module per vendor, registered once with every hook the layers above ask:
  value grammar and order, product names, propose/verify on binaries, DRA attributes, detector
- ``variant``   the model on variantlib: properties, labels, index documents, ordering, selection
- ``api``       the wire shapes the node agent and the scheduler share (the names a heartbeat carries)
- ``providers`` what this host and each of its devices supports (CPU plugins, NVML, KFD
  sysfs, device descriptors, ``--gpus``)
- ``oci``       the registry client (one HTTP client factory), the scan and the image index
- ``docker``    the Docker engine: pull, push, tag, build, events
- ``contents``  what an image's binaries need: tar, ELF, fatbin and offload parsers
- ``planner``   the pure planner: the pool and the search that put one variant on a gang
  (what ``variant-scheduler`` and ``k8s gang`` both plan with; no SQL, no HTTP)
- ``publish`` and ``k8s``: the matrix build and the variant image index; DRA claims, node
  labels, containerd hosts files and gangs
- ``server``    what both servers share: bounded bodies, options, TLS, logs, OCI error bodies
- ``proxy`` and ``scheduler``: ``variant-proxy`` and ``variant-scheduler`` (which never detects)
- ``agent``     the node agent: a scheduler client on top of ``providers``
- commands: ``cli`` and ``render`` (``docker-variant`` and the Docker CLI plugin), ``entry``,
  ``extras`` (which optional install each server command needs), the servers'
  ``__main__`` modules and ``agent.command`` (``variant-scheduler agent``)
"""

__version__ = "0.1.0"
