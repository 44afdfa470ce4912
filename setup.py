"""Build hook for the optional C accelerator of forkserve.share().

Everything else lives in setup.cfg. The extension is optional: where it
cannot be compiled, forkserve.share() uses its pure-Python walker.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "forkserve.memory._immortal",
            sources=["forkserve/memory/_immortal.c"],
            optional=True,
        )
    ]
)
