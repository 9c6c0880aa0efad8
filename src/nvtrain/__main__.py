"""``python -m nvtrain`` is the same as the ``nvtrain`` command."""

import os
import sys

try:
    from nvtrain.cli import main

    main()
except KeyboardInterrupt:
    # Ctrl-C between loading the CLI and entering ``main``, which handles it from then on:
    # exit 130 with the line ``main`` prints, not a traceback (see nvtrain.cli._interrupt).
    sys.stderr.write("nvtrain: interrupted (SIGINT)\n")
    sys.stderr.flush()
    os._exit(130)
