"""The tiny ReTool demo's three configs (``demo.yaml``, ``sft.yaml``, ``grpo.yaml``), shipped with
the package so that ``agentloop demo`` runs from a wheel; ``recipes/tiny_retool/`` links here."""
