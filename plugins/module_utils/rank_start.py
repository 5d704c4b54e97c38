"""Node-side: a start's rank containers, created and started through community.docker's own
Docker API client (the one its docker_container module drives), in the same module run that
makes the run's folder (run_state's state=present): one call per node for the whole start,
where docker_container was one more module run per unit.

A unit is the launch spec's (torchfleet.units): its name, command, working folder, user, env
(each value a string, as docker_container takes them), labels, mounts, devices, cpusets and
oom_kill_disable. Every container runs as the launch has always run them: host networking,
docker's init, no restart policy. A new run's units have new names (the run id is in them);
one that exists already is left as it is, running or not, as docker_container state=started
leaves a container whose configuration it was not asked to change.
"""

from __future__ import annotations

try:
    from ansible_collections.community.docker.plugins.module_utils._api.api.client import APIClient
    from ansible_collections.community.docker.plugins.module_utils._api.errors import APIError, NotFound
except ImportError as exc:  # community.docker is the roles' dependency (galaxy.yml)
    APIClient = None
    IMPORT_ERROR = exc
else:
    IMPORT_ERROR = None


def _devices(devices):
    """docker run's --device strings (host[:container[:permissions]]) as the API takes them."""
    found = []
    for device in devices or []:
        parts = device.split(":")
        host, inside = parts[0], parts[1] if len(parts) > 1 else parts[0]
        found.append({"PathOnHost": host, "PathInContainer": inside, "CgroupPermissions": parts[2] if len(parts) > 2 else "rwm"})
    return found


def _mounts(mounts):
    """docker_container's mounts (source, target, type, read_only) as the API takes them."""
    return [{"Source": m.get("source"), "Target": m["target"], "Type": m.get("type") or "bind",
             "ReadOnly": bool(m.get("read_only"))} for m in mounts or []]


def create_request(unit, image):
    """The Docker Engine API's container create body for a unit of the launch spec."""
    host = {"NetworkMode": "host", "Init": True, "RestartPolicy": {"Name": "no"},
            "Mounts": _mounts(unit.get("mounts")), "Devices": _devices(unit.get("devices")),
            "OomKillDisable": bool(unit.get("oom_kill_disable"))}
    if unit.get("cpuset"):
        host["CpusetCpus"] = str(unit["cpuset"])
    if unit.get("cpuset_mems"):
        host["CpusetMems"] = str(unit["cpuset_mems"])
    body = {"Image": image, "Cmd": [str(word) for word in unit["command"]], "WorkingDir": unit.get("workdir") or "",
            "Env": [f"{key}={value}" for key, value in sorted((unit.get("env") or {}).items())],
            "Labels": {str(k): str(v) for k, v in (unit.get("labels") or {}).items()}, "HostConfig": host}
    if unit.get("user"):
        body["User"] = str(unit["user"])
    return body


def start(units, image, base_url="unix:///var/run/docker.sock"):
    """Create and start each unit's container; returns the names of those it started. An
    APIError (an image the node lacks, a name another container holds) stops at that unit,
    raised with the unit's name."""
    if APIClient is None:
        raise RuntimeError(f"community.docker's Docker API client cannot be imported: {IMPORT_ERROR}")
    client = APIClient(base_url=base_url)
    started = []
    try:
        for unit in units:
            try:
                client.get_json("/containers/{0}/json", unit["name"])
                continue  # there already: a start that was asked twice
            except NotFound:
                pass
            try:
                made = client.post_json_to_json("/containers/create", data=create_request(unit, image),
                                                params={"name": unit["name"]})
                client.post_json("/containers/{0}/start", made["Id"])
            except APIError as exc:
                raise RuntimeError(f"{unit['name']}: {exc}") from exc
            started.append(unit["name"])
    finally:
        client.close()
    return started
