"""The NVIDIA Resiliency Extension (NVRx) boundary: every place nvtrain touches NVRx lives here.

Nothing outside this package imports or names ``nvidia_resiliency_ext``
(``tests/top/test_import_graph.py`` checks it). Importing the package is cheap: it never imports
NVRx or torch; the modules that do import them inside functions, or are run as programs
(``ftmain``). ``versions`` tells the NVRx releases apart from package metadata alone.
"""

from nvtrain.nvrx.versions import DISTRIBUTION, NO_RESTART_EXIT_CODE, TESTED, NvrxVersion, installed_nvrx

__all__ = ["DISTRIBUTION", "NO_RESTART_EXIT_CODE", "TESTED", "NvrxVersion", "installed_nvrx"]
