"""The tiny Search-R1 demo's three configs (``demo.yaml``, ``sft.yaml``, ``grpo.yaml``) and its GPU
overlay, shipped with the package; ``recipes/tiny_search_r1/`` links here."""
