"""Build hook for the optional C accelerators: forkserve.share()'s walker,
`forkserve memory --why`'s walk, the hold on the allocators' free space
across a worker's fork (forkserve.memory.free_space), and the usual HTTP
request and response heads (forkserve.http.accel), and threading.local per
greenlet (forkserve.process.greenlet_local).

Everything else lives in setup.cfg. The extensions are optional: where one
cannot be compiled, its pure-Python code is used instead.
"""
from setuptools import Extension, setup

# The headers the extensions share: an edit to one rebuilds each that includes it.
ADDRSET = ["forkserve/memory/_addrset.h"]  # the address set of the walks
MODULE = ["forkserve/_module.h"]           # how each is built as a module
INCLUDE = ["forkserve"]                    # where _module.h is found

setup(
    ext_modules=[
        Extension(
            "forkserve.memory._immortal",
            sources=["forkserve/memory/_immortal.c"],
            depends=ADDRSET + MODULE,
            include_dirs=INCLUDE,
            optional=True,
        ),
        Extension(
            "forkserve.memory._free_space",
            sources=["forkserve/memory/_free_space.c"],
            depends=MODULE,
            include_dirs=INCLUDE,
            libraries=["dl"],  # dlopen/dlsym: in libc itself from glibc 2.34
            optional=True,
        ),
        Extension(
            "forkserve.memory._whywalk",
            sources=["forkserve/memory/_whywalk.c"],
            depends=ADDRSET + MODULE,
            include_dirs=INCLUDE,
            optional=True,
        ),
        Extension(
            "forkserve.http._h1",
            sources=["forkserve/http/_h1.c", "forkserve/http/_h1_connection.c"],
            depends=MODULE + ["forkserve/http/_h1.h"],
            include_dirs=INCLUDE,
            optional=True,
        ),
        Extension(
            "forkserve.process._greenlet_local",
            sources=["forkserve/process/_greenlet_local.c"],
            depends=MODULE,
            include_dirs=INCLUDE,
            optional=True,
        ),
    ]
)
