"""The GPU host: NVML access, inventory, `nvidia-smi topo -m` topology, GPU allocation for a TP
group, preflight checks before a server starts, and process-group teardown after it stops."""

import re

#: A host name draftboard accepts: it becomes the Celery queue `host.<name>` and a URL path segment
#: (1-100 letters, digits, '.', '_', '-', starting with a letter or digit). The one rule, read by
#: runs.services.hosts, sweep files' `hosts:` and offline bundles.
HOST_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
HOST_NAME_RE = re.compile(HOST_NAME_PATTERN)
