"""Example run configs shipped with the package (YAML); see ``agentloop train --help``."""
