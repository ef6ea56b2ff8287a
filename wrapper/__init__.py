"""execve wrappers: the Python reference client and the native (C) preload shim and wrapper."""
