"""Fuzz targets (``targets.py``), their corpus (``corpus/<target>/``) and the coverage-guided
runner (``run.py``, atheris/libFuzzer); ``tests/test_fuzz_parsers.py`` runs them in the suite
and ``scripts/fuzz`` for longer by hand."""
