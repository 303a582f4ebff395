"""A stand-in for the Hugging Face Hub's HTTP API, for push and download tests (the network
is unreachable).

Point a process at it with ``hub_env(...)`` (``HF_ENDPOINT``); it answers just enough of
``create_repo`` + ``upload_folder`` with small files (uploaded inline in the commit), and
of ``snapshot_download`` for the model repos in ``models`` (repo info, file tree, file
downloads), and records every request, so a test can check what the real
``huggingface_hub`` client sent and fetched.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class FakeHub:
    endpoint: str
    refuse_commits: bool = False  # answer commits 403, as the Hub does to a token without write access
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    models: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo id -> {path in the repo: content}
    commit: str = "c" * 40  # the one revision every model repo has

    def created_repo(self) -> dict:
        """The body of the (single) create-repo request."""
        return json.loads(next(body for method, path, body in self.requests if path == "/api/repos/create"))

    def commits(self, repo_id: str) -> list[bytes]:
        return [body for method, path, body in self.requests if path == f"/api/models/{repo_id}/commit/main"]

    def uploaded(self, repo_id: str) -> dict[str, bytes]:
        """Path in the repo -> content, of every file the commits to ``repo_id`` carried."""
        files = {}
        for commit in self.commits(repo_id):
            for line in map(json.loads, commit.decode().splitlines()):
                if line["key"] == "file":
                    files[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
        return files


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hub.requests.append(("POST", self.path, body))
            if self.path == "/api/repos/create":
                request = json.loads(body)
                self._reply({"url": f"{hub.endpoint}/{request['organization']}/{request['name']}"})
            elif "/preupload/" in self.path:
                files = json.loads(body)["files"]
                self._reply({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                       for f in files]})
            elif "/commit/" in self.path and hub.refuse_commits:
                self._reply({"error": "You don't have the rights to create a commit in this repo"}, status=403)
            elif "/commit/" in self.path:
                repo = self.path.split("/api/models/", 1)[1].split("/commit/", 1)[0]
                self._reply({"commitUrl": f"{hub.endpoint}/{repo}/commit/{'a' * 40}", "commitOid": "a" * 40})
            else:
                self._reply({"error": "not here"}, status=404)

        def do_GET(self) -> None:  # noqa: N802
            hub.requests.append(("GET", self.path, b""))
            repo, listing = self._model_listing()
            if listing == "revision":
                self._reply({"id": repo, "sha": hub.commit, "siblings": [{"rfilename": p} for p in hub.models[repo]]})
            elif listing == "tree":
                self._reply([{"type": "file", "path": p, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                             for p, data in hub.models[repo].items()])
            elif (data := self._file()) is not None:
                self._send(data, "application/octet-stream", headers=self._file_headers(data))
            else:
                self._reply({"error": "Repository not found"}, status=404, headers={"X-Error-Code": "RepoNotFound"})

        def do_HEAD(self) -> None:  # noqa: N802
            hub.requests.append(("HEAD", self.path, b""))
            data = self._file()
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.end_headers()
                return
            self.send_response(200)
            for name, value in self._file_headers(data).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()

        def _model_listing(self) -> tuple[str, str | None]:
            """For ``/api/models/<repo>/revision|tree/<revision>`` of a repo in ``models``: the
            repo and which of the two; else no listing."""
            route = self._route()
            api = route.removeprefix("/api/models/")
            for listing in ("revision", "tree"):
                repo, found, _ = api.partition(f"/{listing}/")
                if api != route and found and repo in hub.models:
                    return repo, listing
            return "", None

        def _route(self) -> str:
            return self.path.split("?", 1)[0]

        def _file(self) -> bytes | None:
            """The content ``/<repo>/resolve/<revision>/<path>`` names, if the repo has it."""
            repo, _, rest = self._route().lstrip("/").partition("/resolve/")
            name = rest.partition("/")[2]
            return hub.models.get(repo, {}).get(name)

        def _file_headers(self, data: bytes) -> dict[str, str]:
            return {"X-Repo-Commit": hub.commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}

        def _reply(self, payload: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
            self._send(json.dumps(payload).encode(), "application/json", status, headers)

        def _send(self, body: bytes, content_type: str, status: int = 200,
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def serve_fake_hub(refuse_commits: bool = False) -> Iterator[FakeHub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    hub = FakeHub(f"http://127.0.0.1:{server.server_address[1]}", refuse_commits)
    server.RequestHandlerClass = _handler(hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()


def unreachable_endpoint() -> str:
    """A local URL nobody listens on: connections are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def hub_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    """Environment of a client process that talks to ``endpoint`` with a dummy write token."""
    return {"HF_ENDPOINT": endpoint, "HF_TOKEN": "hf_test_token", "HF_HOME": str(tmp_path / "hf_home"),
            "HF_HUB_DISABLE_TELEMETRY": "1"}
