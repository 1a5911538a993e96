"""docker-variant: PEP 817/825 variants for container images.

Layers, each importing only the ones above it in this list:

- ``variant``   the model: properties, image labels, index documents, ordering, selection
- ``providers`` what this host (and each of its devices) supports
- ``oci``       a registry client and the client-side index scan
- ``proxy``     ``variant-proxy``, the registry proxy with the ``_variants`` API
- ``docker``    the Docker engine side of ``docker variant pull/push``
- ``cli``       the ``docker-variant`` command line and Docker CLI plugin
"""

__version__ = "0.1.0"
