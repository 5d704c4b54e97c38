"""The molecule leak scan's scanner finds what it looks for, and says where, not what."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

SCANNER = Path(__file__).resolve().parents[2] / "molecule" / "shared" / "files" / "leak_scan.py"
KEYS = {
    "ed25519": lambda: ed25519.Ed25519PrivateKey.generate(),
    "ecdsa": lambda: ec.generate_private_key(ec.SECP256R1()),
    "rsa": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
}


def write_key(folder, kind):
    key = KEYS[kind]()
    private = key.private_bytes(s.Encoding.PEM, s.PrivateFormat.OpenSSH, s.NoEncryption())
    public = key.public_key().public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH)
    (folder / f"ssh_host_{kind}_key").write_bytes(private)
    (folder / f"ssh_host_{kind}_key.pub").write_bytes(public + b" node-1\n")
    return private.decode(), public.decode()


def scan(tmp_path, *paths, allow=()):
    secrets = tmp_path / "secrets"
    (secrets / "needles.json").write_text(json.dumps({"proxy password": "tfleak-proxy-abc123"}))
    args = [sys.executable, str(SCANNER), "--needles", str(secrets / "needles.json"), "--key", str(secrets / "keys"),
            *[f"--allow={a}" for a in allow], *map(str, paths)]
    result = subprocess.run(args, capture_output=True, text=True)
    return result.returncode, json.loads(result.stdout)


@pytest.fixture
def keys(tmp_path):
    (tmp_path / "secrets" / "keys").mkdir(parents=True)
    (tmp_path / "runs").mkdir()
    return {kind: write_key(tmp_path / "secrets" / "keys", kind) for kind in KEYS}


def test_public_halves_and_clean_files_are_not_findings(tmp_path, keys):
    # Public keys hold part of what a private key file holds; they are no secret.
    (tmp_path / "runs" / "known_hosts").write_text("".join(f"[node-1]:12345 {pub}\n" for _, pub in keys.values()))
    (tmp_path / "runs" / "summary.json").write_text('{"http_proxy": "http://***@proxy:3128"}')
    code, out = scan(tmp_path, tmp_path / "runs")
    assert code == 0 and out["findings"] == []
    assert out["needles"] > 1 + 3 * 2


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_secret_a_key_and_a_header_are_found_by_label(tmp_path, keys, kind):
    private = keys[kind][0]
    (tmp_path / "runs" / "launch-v.txt").write_text("env: http://u:tfleak-proxy-abc123@proxy:3128\n")
    # A key re-wrapped into JSON, without its header, still has its lines.
    (tmp_path / "runs" / "result.json").write_text(json.dumps({"content": private.split("-----")[2]}))
    (tmp_path / "runs" / "key.pem").write_text(private)
    code, out = scan(tmp_path, tmp_path / "runs")
    found = {(Path(f["path"]).name, f["what"]) for f in out["findings"]}
    assert code == 1
    assert ("launch-v.txt", "proxy password") in found
    assert any(name == "result.json" and f"ssh_host_{kind}_key line" in what for name, what in found)
    assert ("key.pem", "a private-key header") in found
    assert "tfleak-proxy-abc123" not in json.dumps(out) and private.splitlines()[3] not in json.dumps(out)


def test_a_file_meant_to_hold_a_key_must_be_private(tmp_path, keys):
    key = tmp_path / "runs" / "ssh_host_ed25519_key"
    key.write_text(keys["ed25519"][0])
    key.chmod(0o600)
    assert scan(tmp_path, tmp_path / "runs", allow=["*/ssh_host_*_key"])[0] == 0
    key.chmod(0o644)
    code, out = scan(tmp_path, tmp_path / "runs", allow=["*/ssh_host_*_key"])
    assert code == 1 and out["findings"] == [{"path": str(key), "what": "a secret's file with mode 0o644"}]


def test_a_secret_made_on_the_node_is_looked_for_everywhere_else_and_brought_back(tmp_path, keys):
    """A run's store key, which the launch makes per run (no controller knows it up front):
    its file must be private, its value is found in any other file, and --found writes it
    for the controller's scan."""
    run = tmp_path / "runs" / "20261129-r1"
    run.mkdir()
    key = run / "store.key"
    key.write_text("a3" * 32)
    key.chmod(0o400)
    (run / "guard-0.json").write_text('{"state": "running"}')
    found = tmp_path / "found.json"
    args = ["--secret-file=*/runs/*/store.key", f"--found={found}"]

    def scan_with(*more):
        secrets = tmp_path / "secrets"
        (secrets / "needles.json").write_text(json.dumps({"proxy password": "tfleak-proxy-abc123"}))
        done = subprocess.run([sys.executable, str(SCANNER), "--needles", str(secrets / "needles.json"), *args, *more,
                               str(tmp_path / "runs")], capture_output=True, text=True)
        return done.returncode, json.loads(done.stdout)

    assert scan_with() == (0, {"needles": 2, "findings": []})
    assert json.loads(found.read_text()) == {f"the secret in {key}": "a3" * 32}
    (run / "rank-0.log").write_text(f"store key: {'a3' * 32}\n")
    key.chmod(0o644)
    code, out = scan_with()
    assert code == 1 and sorted((Path(f["path"]).name, f["what"]) for f in out["findings"]) == [
        ("rank-0.log", f"the secret in {key}"), ("store.key", "a secret's file with mode 0o644")]
    assert "a3" * 32 not in json.dumps(out)
