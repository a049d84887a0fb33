"""A real single-node Slurm on loopback, for tests: munged, slurmctld and slurmd as our children.

Built from Debian's `slurm-wlm` and `munge` packages (`make test` installs them when it can,
`.ci/run` always does). Everything lives under one temporary directory: the munge key and socket,
`slurm.conf` (point `SLURM_CONF` at it and `sbatch`/`squeue`/`scontrol` talk to this cluster),
the controller's state, slurmd's spool and the logs. The daemons run in the foreground (`-D`, `-F`)
in their own sessions, so `stop()` can take them and everything they started down; it then checks
that no process of this cluster is left.

There is no slurmdbd (no accounting database): a finished job's state and exit code are read with
`scontrol show job -o` while the controller still remembers it (`MinJobAge`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Debian installs the daemons in /usr/sbin, which a non-login PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel")
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def missing_programs() -> list[str]:
    """The Slurm/munge programs not installed here (empty when the cluster can start)."""
    return [name for name in PROGRAMS if shutil.which(name, path=SEARCH_PATH) is None]


@dataclass(frozen=True)
class JobResult:
    job_id: str
    state: str  # JobState, e.g. COMPLETED
    exit_code: str  # ExitCode "status:signal", e.g. "0:0"
    fields: dict[str, str]  # every field of `scontrol show job -o`


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _node_hardware() -> str:
    """`slurmd -C`'s own view of this machine (CPUs, sockets, cores, threads, memory) for NodeName."""
    out = subprocess.run(
        [shutil.which("slurmd", path=SEARCH_PATH), "-C"], capture_output=True, text=True, check=True
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("NodeName="))
    return " ".join(field for field in line.split()[1:] if not field.startswith("UpTime"))


class SlurmCluster:
    """`with SlurmCluster() as cluster: job = cluster.submit(script); cluster.wait(job)`."""

    def __init__(self, root: Path | None = None, *, partition: str = "debug"):
        # munged insists that every directory above its socket is executable by all, so the root
        # is a fresh 0755 directory under /tmp rather than pytest's private 0700 tmp_path.
        self.root = Path(root or tempfile.mkdtemp(prefix="areal-nb-slurm-"))
        self.root.chmod(0o755)
        self.partition = partition
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "run" / "munge.sock"
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        for sub in ("run", "munge", "state", "spool", "log"):
            (self.root / sub).mkdir(exist_ok=True)
        (self.root / "munge").chmod(0o700)  # munged refuses a key others could read
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._write_conf()
        try:
            self._spawn(
                "munged",
                "-F",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
            )
            self._wait_for(lambda: self.munge_socket.exists(), "munged's socket", timeout)
            self._spawn("slurmctld", "-D", "-f", str(self.conf))
            self._spawn("slurmd", "-D", "-N", "localhost", "-f", str(self.conf))
            self._wait_for(self._node_idle, "node localhost to be idle in sinfo", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Cancel what still runs, stop the daemons, and kill anything of this cluster left over."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            subprocess.run(
                [shutil.which("scancel", path=SEARCH_PATH), "--full", f"--partition={self.partition}"],
                env=self.env(),
                capture_output=True,
                timeout=timeout,
            )
        # slurmd first (it owns the job steps), the controller next, munged last (both use it).
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        for pid in self.leftover_pids():  # e.g. a job step whose slurmstepd went first
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- jobs --------------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment the client commands (and, by sbatch's default --export=ALL, jobs) get."""
        return {**os.environ, "PATH": SEARCH_PATH, "SLURM_CONF": str(self.conf), **(extra or {})}

    def submit(
        self, script: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> str:
        """`sbatch --parsable [args] script`; returns the job id."""
        done = subprocess.run(
            [shutil.which("sbatch", path=SEARCH_PATH), "--parsable", *args, str(script)],
            cwd=cwd,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"sbatch {script} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> JobResult:
        out = self._run("scontrol", "show", "job", "-o", job_id)
        # Fields are Key=Value separated by spaces; values such as Command= may hold '=' themselves.
        fields = dict(re.findall(r"(\S+?)=(\S*)", out))
        return JobResult(job_id, fields.get("JobState", "?"), fields.get("ExitCode", "?"), fields)

    def wait(self, job_id: str, timeout: float) -> JobResult:
        """Poll until the job reaches a final state; on timeout cancel it and raise with its state."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.job(job_id)
            if result.state in FINAL_STATES:
                return result
            if time.monotonic() > deadline:
                self._run("scancel", job_id)
                raise TimeoutError(f"job {job_id} still {result.state} after {timeout:.0f} s; cancelled")
            time.sleep(1.0)

    def leftover_pids(self) -> list[int]:
        """Processes of this cluster still alive: a daemon, slurmstepd, or a job's process (by its
        SLURM_CONF). Empty after `stop()`."""
        marker = str(self.root).encode()
        own = os.getpid()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == own:
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in cmdline or b"SLURM_CONF=" + marker in environ:
                try:  # a zombie (already dead, not yet reaped by its parent) is not left running
                    if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
                except (OSError, IndexError):
                    continue
                found.append(int(entry.name))
        return found

    def log(self, name: str) -> str:
        """A daemon's log (munged, slurmctld, slurmd), for failure messages."""
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- internals ---------------------------------------------------------------------------

    def _write_conf(self) -> None:
        r = self.root
        self.conf.write_text(f"""\
# A one-node cluster on loopback for tests (tests/slurm/cluster.py). No accounting database,
# no cgroups: jobs' processes are tracked through /proc, and finished jobs stay in the
# controller for MinJobAge seconds so `scontrol show job` can report their state.
ClusterName=arealnb
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=3600
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 {_node_hardware()} State=UNKNOWN
PartitionName={self.partition} Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        self._logs.append(log)
        self._procs[name] = subprocess.Popen(
            [shutil.which(name, path=SEARCH_PATH), *args],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _run(self, program: str, *args: str) -> str:
        done = subprocess.run(
            [shutil.which(program, path=SEARCH_PATH), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{program} {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}"
            )
        return done.stdout

    def _node_idle(self) -> bool:
        try:
            return self._run("sinfo", "-h", "-n", "localhost", "-o", "%t").strip() == "idle"
        except (RuntimeError, subprocess.TimeoutExpired):
            return False

    def _wait_for(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    out = (self.root / "log" / f"{name}.out").read_text(errors="replace")
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} while waiting for {what}:\n"
                        f"{out[-2000:]}{self.log(name)[-2000:]}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no {what} after {timeout:.0f} s; slurmctld log:\n{self.log('slurmctld')[-2000:]}"
                    f"\nslurmd log:\n{self.log('slurmd')[-2000:]}"
                )
            time.sleep(0.2)
