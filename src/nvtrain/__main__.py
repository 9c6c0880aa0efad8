"""``python -m nvtrain`` is the same as the ``nvtrain`` command."""

from nvtrain.cli import main

main()
