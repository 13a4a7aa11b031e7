"""The layers of the tree, enforced by Bazel visibility (issue 19, step 6).

Libraries (libs/<name>) sit in layers: a library is visible to the libraries of the
layers above its own, never to its own layer's or lower ones, so a lower library
cannot reach up (libs/common cannot depend on libs/transport, libs/dist cannot depend
on libs/model). Everything outside libs/ (services, tests, benchmarks, fuzzers, tools)
may use any library, and so may the libraries' own tests (libs/<name>/tests). Services are visible to services/ and to what tests or measures
them, never to libs/: libraries never use services.

    load("//tools:layers.bzl", "lib_visibility")
    package(default_visibility = lib_visibility("transport"))

A new library gets a layer here; tools/check_layers.sh checks that every library
package declares its layer and that a dependency that reaches up is refused.
"""

# Lowest first. A library may depend only on libraries of lower layers.
LAYERS = [
    ["common", "http", "metrics", "rl", "nccl_tuning"],
    ["redis", "gpu", "transport", "rpc", "tasks"],
    ["dist", "reshard", "registry"],
    ["model"],
    ["service"],
]

# What may use any library, and any service.
_OUTSIDE_LIBS = [
    "//bench:__subpackages__",
    "//examples:__subpackages__",
    "//fuzz:__subpackages__",
    "//loadtest:__subpackages__",
    "//services:__subpackages__",
    "//tests:__subpackages__",
    "//tools:__subpackages__",
]

def _layer_of(name):
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    fail("libs/%s has no layer: add it to LAYERS in tools/layers.bzl" % name)

def lib_visibility(name):
    """The visibility of libs/<name> and its subpackages."""
    mine = _layer_of(name)
    above = []
    for layer in LAYERS[mine + 1:]:
        for other in layer:
            above.append("//libs/%s:__subpackages__" % other)
    # Tests are consumers, not layers: a library's tests may use any library (e.g.
    # libs/dist's test that a model trains alike on one rank and on two).
    tests = ["//libs/%s/tests:__pkg__" % lib for layer in LAYERS for lib in layer]
    return ["//libs/%s:__subpackages__" % name] + above + tests + _OUTSIDE_LIBS

def service_visibility():
    """The visibility of a service's package: services, tests, benchmarks, tools; not libs."""
    return _OUTSIDE_LIBS
