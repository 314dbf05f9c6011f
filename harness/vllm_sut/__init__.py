"""vLLM's own decision functions (vllm==0.33.0) as a second system under test.

Importing this package does not import vLLM; `available.vllm_version()` says whether it can.
The other modules import vLLM at the top and are only imported once it is known to import.

vLLM runs here with its CPU platform on every machine: its CUDA platform needs the compiled
extensions, which a GPU machine without a registry lacks (tools/vllm_gpu_bundle.py leaves them
out). The choice is made before any harness module imports vLLM: each of them is in this
package or in harness.vllm_exec, which imports this one first. What the CUDA platform would
supply to the execution code is stood in (harness/vllm_exec/stand_ins.py).
"""

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from harness.vllm_sut import system  # noqa: E402, F401 - puts vLLM's code in the rank's slots
