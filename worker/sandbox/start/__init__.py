"""Every way the sandbox starts a command, in one folder.

A call's command starts in one of these ways, chosen by what the machine gives (``layers.plan_for``)
and by what is ready:

- **no control group** (``command``): where the worker may make no group, the command line of the
  plan is started by ``subprocess.Popen`` on the call's path; nothing can be made ahead.
- **a launch** (``launch``): the call's groups with a process already in them, waiting for the
  call's line; made by programs (a shell joins the groups, then the guard, ``unshare`` and the
  init: ``shell_text``), or, for a root worker, by its spawner with system calls
  (``spawner_process``, the worker's side in ``spawner_client``; the processes it made are found
  through ``proc_lookup``).
- **made ahead or now** (``ready_pool``): launches are made between calls by one thread of each
  worker process, for any run or for one run alone (its folders bound, its init already the run's
  uid); a call that finds none ready makes its own (``launch.made_now``).
"""
