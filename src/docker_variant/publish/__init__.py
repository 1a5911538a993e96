"""Publishing a variant set that any registry serves (SPEC section 10): the variant image
index (``publisher.py``) and the matrix build (``matrix.py`` parses, ``build.py`` drives
the engine)."""
