"""nvcc from /usr/local/cuda in a genrule: sm_90 machine code plus compute_90 PTX.

cuda_library(name, srcs = ["x.cu"], hdrs = [...], deps = [...]) compiles each .cu to a
position-independent object and wraps the objects in a cc_library linked against the
CUDA runtime and NCCL (@system//:cuda). Compiles and links on machines without a GPU;
tests that run the code carry the tag "gpu".
"""

_NVCC = "/usr/local/cuda/bin/nvcc"

_NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O2",
    "-gencode arch=compute_90,code=[sm_90,compute_90]",
    "-Xcompiler -fPIC",
])

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None):
    objs = []
    for src in srcs:
        obj = src[:-len(".cu")] + ".pic.o"
        objs.append(obj)
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = "%s %s %s -I. -I$(GENDIR) -c $(location %s) -o $@" %
                  (_NVCC, _NVCC_FLAGS, " ".join(copts), src),
            message = "nvcc " + src,
        )
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@system//:cuda"],
        visibility = visibility,
    )
