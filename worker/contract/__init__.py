"""The contract floor: all the orchestrator (``api``) and the workers share, and nothing else.

What both sides agree on, as data, names and rules: what crosses between them. The code both
run the same way stands on it in ``worker.plumbing``. ``api`` imports from ``worker`` only
these two and the tool model (``worker.tools``); the rest of ``worker`` is the workers' own,
reached by messages and keys named here, or by starting its programs (``tests/test_layers.py``
holds both sides to it). The parts:

- ``wire``: the pools and the task name, a call and its answer, a tool as the fleet serves it,
  a worker's heartbeat, the rule a workspace-relative glob follows.
- ``operations``: the service operations (``toolq.exec``, ``toolq.put_files``, ...) as typed
  requests and answers.
- ``keys``: every Redis key both sides read and write.
- ``limits``: the output caps, transfer and file-count limits, and text cut to a cap.
- ``deadlines``: a call's time limit, by one rule wherever the tool runs.
- ``errors``: the error kinds an answer carries, ``ToolqError`` (every toolq exception's base)
  and the exceptions both sides raise or catch.
- ``settings``, ``settings_check``, ``uid_range``, ``mcp_servers``: the ``TOOLQ_*`` settings both
  sides read, and the formats of their values.
- ``image_reference``: what an image reference may be.
"""
