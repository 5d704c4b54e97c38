"""launch_mode mpirun: sshd in the training image on every other node, then mpirun on the
master over torchfleet's SSH mesh (the ssh_mesh role)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Mapping

from torchfleet import netif, rank_logs
from torchfleet.errors import InventoryError
from torchfleet.modes import LaunchMode, Unsupported, refuse_restarts, register
from torchfleet.modes.context import PIN, NodeContext, pin_env
from torchfleet.units import CONTAINER_WORKLOAD, Mount
from torchfleet import run_vocab

# mpirun's tagged output, on the master node and in runs/RUN/.
LOG = "mpirun.log"


class Mpirun(LaunchMode):
    name = "mpirun"
    # Open MPI's ranks start over ssh, not from docker: they source their secrets from a file.
    secret_env_file = True

    SETTINGS = {
        "mpirun_args": ("launch_mpirun_args", list), "ssh_port": ("launch_ssh_port", int),
        "ssh_user": ("launch_ssh_user", str), "ssh_uid": ("launch_ssh_uid", int), "ssh_gid": ("launch_ssh_gid", int),
        "ssh_node_dir": ("launch_ssh_node_dir", str), "ssh_client_dir": ("launch_ssh_client_dir", str),
        "ssh_container_dir": ("launch_ssh_container_dir", str), "sshd_path": ("launch_sshd_path", str),
        "ssh_launcher": ("ssh_mesh_launcher", str),
    }

    def node_roles(self, job: Mapping[str, Any]) -> frozenset[str]:
        # The SSH mesh that mpirun starts its ranks over (roles/ssh_mesh).
        return super().node_roles(job) | {"ssh_mesh"}

    def unsupported(self, job: Mapping[str, Any]) -> tuple[Unsupported, ...]:
        why = "one mpirun launcher starts every rank over SSH, so the guards cannot restart the ranks or a subset of them"
        return super().unsupported(job) + (refuse_restarts(job, why),)

    def pod_refusal(self, job: Mapping[str, Any]) -> tuple[str, str] | None:
        return ("launch_mode", "launch_mode=mpirun starts the ranks over torchfleet's SSH mesh (ssh_mesh: sshd in "
                               "every node's container); in a pod torchrun starts them, so render launch_mode "
                               "container or torchrun")

    def check_node(self, host: str, settings: Mapping[str, Any], table: Mapping[str, Any]) -> None:
        if settings.get("ssh_launcher") not in (None, "", table["master_host"]):
            raise InventoryError(f"ssh_mesh_launcher={settings['ssh_launcher']} but node rank 0 is "
                                 f"{table['master_host']}; mpirun runs on the master node, so make them the same "
                                 "host", host, "ssh_mesh_launcher")

    def run_owner(self, settings: Mapping[str, Any]) -> str | None:
        # The ranks run as the mesh's user and write into the run's folder.
        return f"{settings.get('ssh_uid', 61000)}:{settings.get('ssh_gid', 61000)}"

    def node_facts(self, host: str, table: Mapping[str, Any], probe: Mapping[str, Any]) -> dict[str, Any]:
        if host != table["master_host"]:
            return {}
        return {"mpi_network": netif.address_network(host, str(table["master_addr"]), probe.get("ip_addr"))}

    def probe(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The mesh's files, the node's account of the mesh's uid, and the image's."""
        return {"paths": list(mesh_paths(settings).values()), "uid": settings["ssh_uid"],
                "image_uid": settings["ssh_uid"]}

    def node_checks(self, host: str, reading: Mapping[str, Any], image_account: Mapping[str, Any] | None,
                    settings: Mapping[str, Any], table: Mapping[str, Any], image: str) -> list[dict[str, Any]]:
        return mesh_checks(reading, image_account, settings, host == table["master_host"], image)

    def run_files(self, host: str, master: bool) -> list[tuple[str, str]]:
        return [(LOG, LOG)] if master else []

    def finals(self, spec: Mapping[str, Any], run_dir: Path, finals: list[dict[str, Any]],
               reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """Rank logs and states come from mpirun's tagged output and exit."""
        path = run_dir / LOG
        log = path.read_text(errors="replace") if path.is_file() else ""
        world_size = int(spec["world_size"])
        for rank, text in split_log(log, world_size).items():
            (run_dir / run_vocab.rank_log(rank)).write_text(text)
        launcher = next((f for f in finals if f.get("role") == "mpirun"), {})
        if reason and log:
            reason = f"{reason}\n--- last lines of mpirun ---\n{rank_logs.tail(log)}"
        return rank_finals(launcher, log, world_size), reason

    def build(self, ctx: NodeContext) -> None:
        """sshd in the training image on every other node, then mpirun on the master over the
        ssh_mesh. Open MPI binds nothing; each rank sources its node's env file, takes the
        torchrun-style variables from Open MPI's and pins itself (node.env: -x passes one value
        to every node, but the interface, threads and cpusets are the node's own)."""
        s = ctx.settings
        user = self.run_owner(s)
        env = ctx.env()
        env.update(NODE_RANK=str(ctx.rows[0]["node_rank"]), OMP_NUM_THREADS=str(ctx.threads[0]), **pin_env(ctx))
        env.pop("PYTHONUNBUFFERED")
        ctx.files = {"node.env": "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())
                                         if k not in ctx.secret_names)}
        workload = ctx.workload_argv() + ctx.args()
        container_dir = s.get("ssh_container_dir", "/etc/torchfleet/ssh")
        if ctx.is_master:
            hosts = ",".join(f"{r['host']}:{r['local_world_size']}" for r in ctx.table["ranks"] if r["local_rank"] == 0)
            network = ctx.node.get("mpi_network") or ""
            argv = ["mpirun", "-np", str(ctx.table["world_size"]), "-H", hosts, "-bind-to", "none", "-map-by", "slot",
                    "--tag-output", "-wdir", CONTAINER_WORKLOAD,
                    "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PATH", "-x", "PYTHONUNBUFFERED",
                    "--mca", "oob_tcp_if_include", network, "--mca", "btl_tcp_if_include", network,
                    *[str(a) for a in s.get("mpirun_args") or []],
                    "/bin/sh", "-c", _MPI_RANK, "rank", *workload]
            ssh_dir = f"/home/{s.get('ssh_user', 'torchfleet')}/.ssh"
            ctx.unit(name=ctx.name("mpirun"), role="mpirun", phase=1, argv=argv,
                     env={"MASTER_ADDR": str(ctx.table["master_addr"]), "MASTER_PORT": str(ctx.table["master_port"]),
                          "PYTHONUNBUFFERED": "1"},
                     ranks=[int(r["rank"]) for r in ctx.table["ranks"]], user=user, secret_env=[],
                     labels=ctx.labels("mpirun"),
                     mounts=ctx.mounts() + [Mount(s.get("ssh_client_dir", "/etc/torchfleet/ssh-client"), ssh_dir,
                                                  True).docker()])
        else:
            ctx.unit(name=ctx.name("sshd"), role="sshd", phase=0,
                     argv=[s.get("sshd_path", "/usr/sbin/sshd"), "-D", "-e", "-f", f"{container_dir}/sshd_config"],
                     env={}, ranks=[], user=user, secret_env=[], labels=ctx.labels("sshd"),
                     listen={"host": str(ctx.rows[0]["address"]), "port": int(s.get("ssh_port", 12345))},
                     mounts=ctx.mounts() + [Mount(s.get("ssh_node_dir", "/etc/torchfleet/ssh"), container_dir,
                                                  True).docker()])
        unit = ctx.name("mpirun")
        for i, row in enumerate(ctx.rows):
            rank_env = ctx.rank_env(row, i)
            rank_env.update(pin_env(ctx))
            ctx.rank(row, i, "mpirun", unit, workload, rank_env, user=user)


# Each mpirun rank: its node's environment, the secret part where there is one, the
# torchrun-style names from Open MPI's, then its own cpuset.
_MPI_RANK = (
    f'set -a; . /out/node.env; [ ! -f /out/{run_vocab.SECRET_ENV} ] || . /out/{run_vocab.SECRET_ENV}; set +a; '
    'export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" '
    'LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"; '
    + PIN.format(local="$OMPI_COMM_WORLD_LOCAL_RANK"))


def mesh_paths(settings: Mapping[str, Any]) -> dict[str, str]:
    """The SSH mesh's file that the mpirun mode needs of a node: the launcher's ssh client
    configuration on the master, sshd's configuration on the others."""
    return {"master": f"{settings['ssh_client_dir']}/config", "worker": f"{settings['ssh_node_dir']}/sshd_config"}


def mesh_checks(reading: Mapping[str, Any], image_account: Mapping[str, Any] | None, settings: Mapping[str, Any],
                master: bool, image: str) -> list[dict[str, Any]]:
    """The mpirun mode's check_input entries for a node: its mesh file is there (``reading``:
    node_probe's, with ``missing`` and ``account``, the node's account of the mesh's uid), no
    login account has that uid (it would own the mesh's private keys), and the image has a
    user of that name and uid (``image_account``: rank_containers', None where the node lacks
    the image, which the runtime check reports)."""
    path = mesh_paths(settings)["master" if master else "worker"]
    uid, user = settings["ssh_uid"], settings["ssh_user"]
    checks = [{"that": path not in (reading.get("missing") or []), "kind": "node", "variable": "launch_mode",
               "msg": f"launch_mode=mpirun but {path} is missing; run site.yml with launch_mode: mpirun "
                      "(it adds the ssh_mesh role)"}]
    account = reading.get("account")
    login = bool(account) and account[6].rsplit("/", 1)[-1] not in ("nologin", "false")
    checks.append({"that": not login, "kind": "node", "variable": "launch_ssh_uid",
                   "msg": f"ssh_mesh_uid {uid} belongs to the login account {account[0] if account else ''} (shell "
                          f"{account[6] if account else ''}), which would own the mesh's private keys; set "
                          "ssh_mesh_uid and ssh_mesh_gid to a uid that no login account has, as the training "
                          f"image's {user} user (61000) does"})
    if image_account is not None:
        entry = image_account.get("entry")
        found = ":".join(entry) if entry else image_account.get("error") or "nothing"
        checks.append({"that": bool(entry) and entry[0] == user, "kind": "node", "variable": "launch_ssh_uid",
                       "msg": f"the image {image} has no user {user} with ssh_mesh_uid {uid} (getent passwd {uid}: "
                              f"{found}); add it to the image (useradd --uid {uid} {user}) or set ssh_mesh_uid and "
                              "ssh_mesh_user to the image's own"})
    return checks


# mpirun --tag-output: "[jobid,rank]<stdout>:text". Open MPI sometimes glues a chunk's
# tag to the end of the previous line, so tags are found anywhere in a line.
TAG_RE = re.compile(r"\[\d+,(?P<rank>\d+)\]<(?:stdout|stderr)>:")
EXIT_RE = re.compile(r"Process name:\s*\[\[\d+,\d+\],(?P<rank>\d+)\]\s*Exit code:\s*(?P<code>\d+)")
SIGNAL_RE = re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node \S+ exited on signal (?P<sig>\d+)")


def split_log(log: str, world_size: int) -> dict[int, str]:
    """Each rank's lines of mpirun's tagged output; mpirun's own lines stay out."""
    ranks: dict[int, list[str]] = {r: [] for r in range(world_size)}
    for line in log.splitlines():
        tags = list(TAG_RE.finditer(line))
        for i, tag in enumerate(tags):
            text = line[tag.end():tags[i + 1].start() if i + 1 < len(tags) else len(line)]
            rank = int(tag["rank"])
            if rank in ranks and (text or len(tags) == 1):
                ranks[rank].append(text)
    return {r: "\n".join(lines) + ("\n" if lines else "") for r, lines in ranks.items()}


def rank_finals(launcher: Mapping[str, Any], log: str, world_size: int) -> list[dict[str, Any]]:
    """Per-rank final states from mpirun's own: its exit, and the rank it names as the first
    to fail. mpirun stops the other ranks itself, so they count as stopped."""
    failed = {}
    if match := EXIT_RE.search(log):
        failed = {int(match["rank"]): int(match["code"])}
    elif match := SIGNAL_RE.search(log):
        failed = {int(match["rank"]): 128 + int(match["sig"])}
    return rank_logs.launcher_finals(launcher, list(range(world_size)), failed, others_stopped=True)


register(Mpirun())
