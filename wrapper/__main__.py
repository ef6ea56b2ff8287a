"""``python -m execgate.wrapper FILE ARGV0 [ARGS...]``: run the reference execve wrapper."""

import sys

from execgate.wrapper.client import main

sys.exit(main())
