"""vLLM's source as data: unified diffs against its tree, applied in memory to private copies
(patch.py), the patch descriptors a config carries (source.py), and which vLLM a tree is
(identity.py). Nothing here imports vLLM; the installed tree is never written to."""
