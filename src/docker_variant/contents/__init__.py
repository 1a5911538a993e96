"""Binary inspection: what an image's own binaries need, read from its layers.

- pure parsers over bytes and seekable streams: ``elf`` (sections, GNU property notes),
  ``fatbin`` (CUDA ``.nv_fatbin`` headers), ``offload`` (clang offload bundles), and
  ``evidence`` (what a file or a path says, as ``Finding`` records);
- ``tarstream``: the one bounded tar reader (gzip inflated in a fixed window, headers
  parsed here, member, header and size budgets), for layers and the engine's export;
- ``walker``: hands each layer's members to the parsers once and merges layers (whiteouts
  applied);
- ``properties``: findings -> variant properties, and labels checked against findings (the
  providers' rules live there);
- I/O around them: ``sources`` (registry and engine), ``check`` (push/publish), ``report``
  (the ``inspect`` command's table and JSON).
"""
