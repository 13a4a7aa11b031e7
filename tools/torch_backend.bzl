"""torch_backend: libtorch-facing code built into a shared library of its own.

No service binary links libtorch itself: the code that needs it is compiled into
`soname` (e.g. librlfleet_model.so), and everything else links that library through the
public cc_library `name`, whose headers have no libtorch in them. On a GPU host,
deploy/gpu/CMakeLists.txt builds the same sources (tools/check_cmake_sources.sh keeps
the two lists equal) against that host's libtorch, and the Bazel-built services load
that build first on LD_LIBRARY_PATH.
"""

def torch_backend(name, soname, srcs, hdrs, impl_deps, deps):
    """Makes `name` (public: `hdrs` and the shared library), `soname` and `name`_impl.

    Args:
      name: the cc_library the rest of the tree depends on.
      soname: the shared library's file name and soname (what a GPU host's build replaces).
      srcs: the sources compiled into it (libtorch included here only).
      hdrs: its public headers, free of libtorch.
      impl_deps: what the sources need (libtorch among them).
      deps: what the public headers need.
    """
    impl = name + "_impl"
    native.cc_library(
        name = impl,
        srcs = srcs,
        hdrs = hdrs,
        visibility = ["//visibility:private"],
        deps = impl_deps,
        alwayslink = True,  # (a shared library keeps only what is linked whole)
    )
    native.cc_binary(
        name = soname,
        linkopts = ["-Wl,-soname," + soname],
        linkshared = True,
        deps = [":" + impl],
    )
    native.cc_library(
        name = name,
        srcs = [":" + soname],
        hdrs = hdrs,
        deps = deps,
    )
