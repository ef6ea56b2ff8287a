"""Policy service: gRPC servicers, rules engine, approvals, audit log."""
