"""Files the workspace operations refuse (absolute paths elsewhere, links that lead out), read and
written by a command in the sandbox instead, with the sandbox user's rights: what a container's
own ``cat`` would see.

They live on the machine of the sandbox worker that ran the command, not in the sample's
workspace: where a fleet's sandbox workers are on several machines, two calls may not see the same
``/tmp``, and Inspect's ``setup`` (a script it writes to ``/tmp``, then runs) needs them to share
it. A sample's own files belong in its workspace.
"""

from __future__ import annotations

import base64
import errno

from api.exceptions import FileProblemError
from api.inspect_sandbox.contract import file_error
from api.runs.workspace import CommandResult, RunWorkspace
from worker.contract.operations import FileProblem

SHELL = "/bin/sh"
#: The exit codes of the scripts below: the file problem each stands for (``file_error`` makes
#: Inspect's exception of it), and a permission denied.
_PROBLEMS: dict[int, FileProblem] = {3: "not_found", 4: "is_a_directory", 6: "too_large"}
_DENIED = 5

_READ = """
f=$1
[ -e "$f" ] || exit 3
[ -d "$f" ] && exit 4
[ -r "$f" ] || exit 5
size=$(wc -c < "$f") || exit 5
[ "$size" -le "$2" ] || exit 6
exec base64 -w 0 -- "$f"
"""

_WRITE = """
f=$1
[ -d "$f" ] && exit 4
mkdir -p -- "$(dirname -- "$f")" 2>/dev/null
if [ -e "$f" ]; then [ -w "$f" ] || exit 5; fi
cat > "$f" || exit 5
"""


async def read_outside(workspace: RunWorkspace, file: str, limit: int, timeout_ms: int) -> bytes:
    """The whole file at ``file``, read in the sandbox; raises as Inspect's ``read_file`` does."""
    result = await workspace.run(
        [SHELL, "-c", _READ, "sh", file, str(limit)],
        timeout_ms=timeout_ms,
        # base64 is four bytes for three, and a little more for the last group.
        output_cap_bytes=limit // 3 * 4 + 8,
    )
    _raise_for(result, file, "read")
    if result.truncated.stdout:  # the fleet's transfer limit is below Inspect's
        raise file_error(FileProblemError("too_large", f"{file!r} is too large"), file)
    return base64.b64decode(result.stdout)


async def write_outside(
    workspace: RunWorkspace, file: str, contents: str | bytes, timeout_ms: int
) -> None:
    """Write ``contents`` to ``file`` in the sandbox, making its folders."""
    result = await workspace.run(
        [SHELL, "-c", _WRITE, "sh", file],
        input=contents.encode("utf-8") if isinstance(contents, str) else contents,
        timeout_ms=timeout_ms,
    )
    _raise_for(result, file, "write")


def _raise_for(result: CommandResult, file: str, verb: str) -> None:
    if result.timed_out:
        raise TimeoutError(f"could not {verb} {file!r} in the sandbox in time")
    code = result.exit_code
    if code == 0:
        return
    if code in _PROBLEMS:
        raise file_error(FileProblemError(_PROBLEMS[code], f"{file!r}"), file)
    if code == _DENIED:
        raise PermissionError(errno.EACCES, "Permission denied", file)
    raise OSError(errno.EIO, f"could not {verb} it in the sandbox: {result.stderr.strip()}", file)
