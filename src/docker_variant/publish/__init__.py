"""Publishing a variant set that any registry serves: the variant image index
(``publisher.py``), the matrix build (``matrix.py`` parses, ``build.py`` builds, checks,
pushes and publishes) and the check of a local image before its push (``verify.py``)."""
