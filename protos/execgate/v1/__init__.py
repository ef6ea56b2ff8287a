"""The execgate.v1 gRPC contract: .proto files and their generated stubs (see scripts/gen_protos.py)."""
