"""toolq's fleet as an Inspect AI sandbox environment, registered as ``toolq``.

Inspect imports this package through the ``inspect_ai`` entry point of the toolq distribution
(``pip install 'toolq[inspect]'``); importing it registers the environment.
"""

from api.inspect_sandbox.environment import ToolqSandboxEnvironment

__all__ = ["ToolqSandboxEnvironment"]
