#!/usr/bin/env python3
"""Look for secrets where they must not be: in files under the given paths.

    leak_scan.py --needles NEEDLES.json... [--key KEYFILE]... [--expand OUT.json]
                 [--allow GLOB]... [--secret-file GLOB]... [--found OUT.json]
                 [--skip PATH]... [PATH]...

NEEDLES.json maps a label to a secret value (several files add up). --key adds the body
lines of a private key file (SSH or PEM), or of every one in a folder, as values of their
own, so a key that leaked in any text form is found;
--expand writes the whole set for a scan elsewhere (a node). Every regular file under the
paths is searched for every value, and for private-key headers. A file that matches
--allow is meant to hold a secret: it is not searched, but it must be private (no group
or other permission bits). A file that matches --secret-file is such a file whose content
is a secret made where the scan runs (a run's store key): it must be private too, and its
content is looked for in every other file; --found writes those for a scan elsewhere (the
controller). --skip leaves a path out (where the needles themselves are
kept). Findings name the file and the label, never the value; the
exit status is 1 when there is any. The scan itself needs Python's standard library only,
as the nodes have it; --key wants the cryptography package (the controller's Ansible has it).
"""

import argparse
import base64
import fnmatch
import json
import os
import re
import stat
import sys

HEADER = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
# A key's first lines are the same in every key of its format (OpenSSH's "openssh-key-v1"
# preamble, say); from the third on they are the key's own.
FIRST_OWN_LINE = 2
# Lines this short (a key's last, its comment and padding) could match by chance.
MIN_LINE = 32
# Larger files are libraries and wheels (torch's), not where a run writes.
MAX_SIZE = 64 * 1024 * 1024


def public_blobs(data):
    """The public half of a private key, as the bytes a public key file or a certificate
    carries; a private key file holds them too, and they are no secret."""
    from cryptography.hazmat.primitives import serialization as s

    try:
        if b"OPENSSH PRIVATE KEY" in data:
            key = s.load_ssh_private_key(data, None)
        else:
            key = s.load_pem_private_key(data, None)
    except (ValueError, TypeError):
        return []  # encrypted: its public half is not in clear either
    public = key.public_key()
    blobs = [public.public_bytes(s.Encoding.DER, s.PublicFormat.SubjectPublicKeyInfo)]
    try:
        blobs.append(base64.b64decode(public.public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH).split()[1]))
    except ValueError:
        pass
    return blobs


def key_lines(path):
    """The body lines of a private key file that are this key's own: not the format's
    preamble, and not a stretch of its public half."""
    with open(path, "rb") as fh:
        data = fh.read()
    lines = [line.strip() for line in data.splitlines()]
    body = [line for line in lines if line and not line.startswith(b"-----") and b":" not in line]
    try:
        raw = base64.b64decode(b"".join(body))
    except ValueError:
        raw = b""
    blobs = public_blobs(data) if raw else []
    own, start = [], 0
    for number, line in enumerate(body):
        # The bytes this line encodes whole, without the one it shares at each end.
        inner = raw[(start * 3 + 3) // 4 + 1:((start + len(line)) * 3) // 4 - 1]
        start += len(line)
        if number >= FIRST_OWN_LINE and len(line) >= MIN_LINE and not any(inner in blob for blob in blobs):
            own.append(line)
    return own


def key_files(path):
    """``path`` if it is a file, else every private key file under it."""
    if os.path.isfile(path):
        return [path]
    found = []
    for candidate in files([path], set()):
        with open(candidate, "rb") as fh:
            if HEADER.search(fh.read(4096)):
                found.append(candidate)
    return sorted(found)


def load_needles(args):
    needles = {}
    for path in args.needles:
        with open(path) as fh:
            needles.update({label: value.encode() for label, value in json.load(fh).items() if value})
    for path in (key for top in args.key for key in key_files(top)):
        for number, line in enumerate(key_lines(path), 1):
            needles[f"private key {path} line {number}"] = line
    return needles


def files(paths, skip):
    for top in paths:
        if os.path.isfile(top):
            yield top
            continue
        for folder, dirs, names in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.realpath(os.path.join(folder, d)) not in skip]
            for name in names:
                path = os.path.join(folder, name)
                if os.path.realpath(path) not in skip:
                    yield path


def secret_files(paths, patterns, skip):
    """The secrets in the files that match ``patterns``, by a label naming the file."""
    found = {}
    for path in files(paths, skip):
        if any(fnmatch.fnmatch(path, pattern) for pattern in patterns) and os.path.isfile(path):
            with open(path, "rb") as fh:
                value = fh.read().strip()
            if len(value) >= MIN_LINE:
                found[f"the secret in {path}"] = value
    return found


def scan(paths, needles, allow, skip):
    findings = []
    for path in files(paths, skip):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        if any(fnmatch.fnmatch(path, pattern) for pattern in allow):
            if info.st_mode & 0o077:
                findings.append({"path": path, "what": f"a secret's file with mode {oct(info.st_mode & 0o777)}"})
            continue
        if info.st_size > MAX_SIZE:
            continue
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if HEADER.search(data):
            findings.append({"path": path, "what": "a private-key header"})
        findings += [{"path": path, "what": label} for label, value in needles.items() if value in data]
    return findings


def write_private(path, needles):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({label: value.decode() for label, value in needles.items()}, fh)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--needles", action="append", required=True)
    parser.add_argument("--key", action="append", default=[])
    parser.add_argument("--expand")
    parser.add_argument("--allow", action="append", default=[])
    parser.add_argument("--secret-file", action="append", default=[])
    parser.add_argument("--found")
    parser.add_argument("--skip", action="append", default=[])
    parser.add_argument("paths", nargs="*")
    args = parser.parse_args()
    needles = load_needles(args)
    if args.expand:
        write_private(args.expand, needles)
    skip = {os.path.realpath(p) for p in (*args.needles, args.expand, args.found, *args.skip) if p}
    paths = [p for p in args.paths if os.path.exists(p)]
    found = secret_files(paths, args.secret_file, skip)
    if args.found:
        write_private(args.found, found)
    findings = scan(paths, {**needles, **found}, args.allow + args.secret_file, skip)
    needles.update(found)
    print(json.dumps({"needles": len(needles), "findings": findings}))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
