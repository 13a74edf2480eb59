"""A stand-in container runtime with docker's command line, for tests on machines without a
container daemon: `run`, `stop`, `image inspect`, `container inspect`, with the exit statuses
and messages of docker 28 for the cases draftboard meets.

State lives in the folder named by FAKE_RUNTIME_STATE: `images` (one local image reference a
line) and `containers/NAME.json` ({"pid"} of a running container). `run --rm --name NAME ...
IMAGE CMD...` starts CMD like a daemon would: in a session of its own, outside the client's
process group, so signalling the client's group does not reach it (only `stop` does), with only
the variables of `--env-file` (plus PATH) and `FAKE_CONTAINER_GPUS` (the `--gpus` value, the
`--device` values joined by spaces). The client waits for it and exits with its status.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_RUNTIME_STATE", "/nonexistent"))
VALUED = {"--name", "--env-file", "--gpus", "-v", "--volume", "--network", "--ipc", "--device", "-e", "--env",
          "--shm-size", "--format", "-t", "--time"}


def _images() -> list[str]:
    path = STATE / "images"
    return path.read_text().split() if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _opts(args: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in VALUED:
            opts.setdefault(args[i], []).append(args[i + 1])
            i += 2
        else:
            opts.setdefault(args[i], []).append("")
            i += 1
    return opts, args[i:]


def run(args: list[str]) -> int:
    opts, rest = _opts(args)
    image, cmd = rest[0], rest[1:]
    if image not in _images():
        print(f"Unable to find image '{image}' locally", file=sys.stderr)
        return 125
    name = opts["--name"][0]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for env_file in opts.get("--env-file", []):
        for line in Path(env_file).read_text().splitlines():
            key, _, value = line.partition("=")
            env[key] = value
    env["FAKE_CONTAINER_GPUS"] = " ".join(opts.get("--gpus", []) + opts.get("--device", []))
    (STATE / "containers").mkdir(parents=True, exist_ok=True)
    record = STATE / "containers" / f"{name}.json"
    if record.exists():
        print(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use.',
              file=sys.stderr)
        return 125
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    record.write_text(json.dumps({"pid": proc.pid, "image": image}))
    code = proc.wait()
    if "--rm" in opts:
        record.unlink(missing_ok=True)
    return code


def stop(args: list[str]) -> int:
    opts, rest = _opts(args)
    timeout = float((opts.get("-t") or opts.get("--time") or ["10"])[0])
    record = STATE / "containers" / f"{rest[0]}.json"
    if not record.exists():
        print(f"Error response from daemon: No such container: {rest[0]}", file=sys.stderr)
        return 1
    pid = json.loads(record.read_text())["pid"]
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _alive(pid):
            break
    print(rest[0])
    return 0


def inspect(kind: str, args: list[str]) -> int:
    _opts_, rest = _opts(args)
    if kind == "image":
        if rest[0] in _images():
            print("sha256:" + hashlib.sha256(rest[0].encode()).hexdigest())
            return 0
        print(f"Error response from daemon: No such image: {rest[0]}", file=sys.stderr)
        return 1
    record = STATE / "containers" / f"{rest[0]}.json"
    if record.exists():
        print("true" if _alive(json.loads(record.read_text())["pid"]) else "false")
        return 0
    print(f"Error response from daemon: No such container: {rest[0]}", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        return run(argv[1:])
    if argv[:1] == ["stop"]:
        return stop(argv[1:])
    if len(argv) >= 2 and argv[1] == "inspect" and argv[0] in ("image", "container"):
        return inspect(argv[0], argv[2:])
    print(f"fake runtime: unsupported command {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
