#!/usr/bin/env python3
"""A private package index for the tests: PEP 503 pages over a folder of wheels, behind a token.

    index_server.py --wheels DIR --token-file FILE --bind ADDR --port N --log FILE

Every request must carry HTTP basic auth whose password is the token (as pip sends
https://__token__:TOKEN@host/simple); without it the answer is 401, so an install that
succeeds proves the token reached pip. The token is read from a file, never the command
line, and the log holds each request's status and path only.
"""

import argparse
import base64
import hashlib
import html
import http.server
import re
from pathlib import Path


def project(wheel: str) -> str:
    return re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, required=True)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    token = args.token_file.read_text().strip()
    wheels = {w.name: w for w in args.wheels.glob("*.whl")}
    log = args.log.open("w", buffering=1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def authorized(self) -> bool:
            scheme, _, value = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "basic":
                return False
            try:
                _, _, password = base64.b64decode(value).decode().partition(":")
            except ValueError:
                return False
            return password == token

        def reply(self, status: int, body: bytes = b"", kind: str = "text/html") -> None:
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="torchfleet-test"')
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            log.write(f"{status} {self.path}\n")

        def page(self, links: dict[str, str]) -> bytes:
            rows = "".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a><br>\n' for text, href in links.items())
            return f"<!DOCTYPE html><html><body>\n{rows}</body></html>\n".encode()

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if not self.authorized():
                return self.reply(401)
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            if parts == ["simple"]:
                names = sorted({project(w) for w in wheels})
                return self.reply(200, self.page({n: f"/simple/{n}/" for n in names}))
            if len(parts) == 2 and parts[0] == "simple":
                mine = sorted(w for w in wheels if project(w) == project(parts[1]))
                if not mine:
                    return self.reply(404)
                digests = {w: hashlib.sha256(wheels[w].read_bytes()).hexdigest() for w in mine}
                return self.reply(200, self.page({w: f"/files/{w}#sha256={digests[w]}" for w in mine}))
            if len(parts) == 2 and parts[0] == "files" and parts[1] in wheels:
                return self.reply(200, wheels[parts[1]].read_bytes(), "application/octet-stream")
            return self.reply(404)

        def log_message(self, *_: object) -> None:
            pass  # the default log would print the request line; ours is written in reply()

    http.server.ThreadingHTTPServer((args.bind, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
