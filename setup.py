"""The one thing pyproject.toml cannot say in a stable form: the proxy's head readers in C.

``optional``: where no C compiler is, the package installs without them and ``proxy/heads.py``
serves its regular expressions (``heads.NATIVE`` is then False).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "docker_variant.proxy._heads",
            sources=["src/docker_variant/proxy/_heads.c"],
            optional=True,
        )
    ]
)
