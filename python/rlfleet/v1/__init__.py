# The generated gRPC stubs of proto/rlfleet/v1 (written here when the package is built).
