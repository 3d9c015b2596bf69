"""The tiny DeepEyes demo's three configs (``demo.yaml``, ``sft.yaml``, ``grpo.yaml``), shipped with
the package so that ``agentloop demo --recipe deepeyes`` runs from a wheel;
``recipes/tiny_deepeyes/`` links here."""
