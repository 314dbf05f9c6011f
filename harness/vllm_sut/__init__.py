"""vLLM's own decision functions (vllm==0.33.0) as a second system under test.

Importing this package does not import vLLM; `available.vllm_version()` says whether it can.
The other modules import vLLM at the top and are only imported once it is known to import.
"""

from harness.vllm_sut import system  # noqa: E402, F401 - puts vLLM's code in the rank's slots
