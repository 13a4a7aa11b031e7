"""protoc + grpc_cpp_plugin code generation from the apt-installed compilers.

rlfleet_proto(name = "common", src = "rlfleet/v1/common.proto", deps = [...]) makes:
  :common_proto      a filegroup with the .proto (for tools that read schemas)
  :common_cc_proto   cc_library with the message types (.pb.h / .pb.cc)
  :common_cc_grpc    cc_library with the service stubs (.grpc.pb.h / .grpc.pb.cc),
                     only when grpc = True
Must be called from the package that is the proto root (//proto), so that generated
headers are included as "rlfleet/v1/common.pb.h".
"""

_PROTOC = "/usr/bin/protoc"
_GRPC_PLUGIN = "/usr/bin/grpc_cpp_plugin"

def rlfleet_proto(name, src, deps = [], grpc = True, visibility = ["//visibility:public"]):
    base = src[:-len(".proto")]
    pb = [base + ".pb.h", base + ".pb.cc"]
    gpb = [base + ".grpc.pb.h", base + ".grpc.pb.cc"] if grpc else []
    dep_protos = [d + "_proto" for d in deps]

    native.filegroup(
        name = name + "_proto",
        srcs = [src] + dep_protos,
        visibility = visibility,
    )

    grpc_flags = ""
    if grpc:
        grpc_flags = "--grpc_out=$(GENDIR)/%s --plugin=protoc-gen-grpc=%s " % (native.package_name(), _GRPC_PLUGIN)
    native.genrule(
        name = name + "_gen",
        srcs = [src] + dep_protos,
        outs = pb + gpb,
        cmd = ("%s -I%s --cpp_out=$(GENDIR)/%s " % (_PROTOC, native.package_name(), native.package_name()) +
               grpc_flags + "$(location %s)" % src),
        message = "protoc " + src,
    )

    native.cc_library(
        name = name + "_cc_proto",
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        includes = ["."],
        deps = [d + "_cc_proto" for d in deps] + ["@system//:protobuf"],
        visibility = visibility,
    )
    if grpc:
        native.cc_library(
            name = name + "_cc_grpc",
            srcs = [base + ".grpc.pb.cc"],
            hdrs = [base + ".grpc.pb.h"],
            includes = ["."],
            deps = [name + "_cc_proto", "@system//:grpc"],
            visibility = visibility,
        )
