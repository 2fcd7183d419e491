"""The folder under a workspace root where the workers keep toolq's own state, beside the runs'
workspaces: the fleet's key (``sandbox.fleet_key``), the uid claims and the runs' private /tmp
(``sandbox.identity``, ``sandbox.host_registry``), the runs' volumes (``sandbox.volumes``), the
marks of workspaces over their quota (``quota``) and the trash (``retention``).

No run's workspace can be it: a run id cannot start with a dot
(``worker.contract.wire.RUN_ID_PATTERN``). Only the workers read it, so it is stated here, not in
the contract.
"""

#: The state folder's name under the workspace root.
STATE_DIR = ".toolq"
