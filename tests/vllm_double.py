"""A loopback stand-in for a running vLLM server (the shapes are described in
``tests/validate/test_vllm_remote.py``): :class:`FakeVllm` holds its state, :func:`serve_fake` serves it."""

from __future__ import annotations

import http.server
import json
import threading
from dataclasses import dataclass, field

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
K = 7  # the bundled drafter's num_speculative_tokens
OUTPUT = [504, 3060, 314, 2]


@dataclass
class FakeVllm:
    """State of one stand-in server; every answer is built from it."""

    root: str = HUB_ID
    k: int = K
    spec: bool = True
    fingerprint: str = "vllm-0.32.0-tp3-0123abcd"
    extra_requests: int = 0  # other traffic: requests counted per own request
    output: list = field(default_factory=lambda: list(OUTPUT))
    key: str | None = None
    server_info: dict | None = None  # the speculative_config /server_info reports (None: no such endpoint)
    prompt_echo: list | None = None  # prompt_token_ids answered (None: the prompt as sent)
    counters: dict = field(default_factory=lambda: {"drafts": 0, "draft_tokens": 0, "accepted": 0, "success": 0,
                                                     "gen": 0, "pos": [0] * K})
    seen: list = field(default_factory=list)
    prompts: list = field(default_factory=list)  # the token-id prompt of every completion request

    def metrics(self) -> str:
        c, lab = self.counters, 'model_name="m",engine="0"'
        lines = ["# HELP vllm:request_success_total Count of successfully processed requests.",
                 "# TYPE vllm:request_success_total counter",
                 f'vllm:request_success_total{{{lab},finished_reason="stop"}} {float(c["success"])}',
                 f'vllm:request_success_total{{{lab},finished_reason="length"}} 0.0',
                 f"vllm:generation_tokens_total{{{lab}}} {float(c['gen'])}",
                 f"vllm:generation_tokens_created{{{lab}}} 1.7e9"]
        if self.spec:
            lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(c['drafts'])}",
                      f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e9",
                      f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(c['draft_tokens'])}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(c['accepted'])}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(v)}'
                      for i, v in enumerate(c["pos"])]
        return "\n".join(lines) + "\n"

    def complete(self, body: dict) -> dict:
        self.prompts.append(body["prompt"])
        c = self.counters
        c["drafts"] += 3
        c["draft_tokens"] += 3 * self.k
        c["accepted"] += 2
        c["pos"][0] += 2
        c["success"] += 1 + self.extra_requests
        c["gen"] += len(self.output) + 10 * self.extra_requests
        prompt = self.prompt_echo if self.prompt_echo is not None else body["prompt"]
        return {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                "system_fingerprint": self.fingerprint,
                "choices": [{"index": 0, "text": "x", "finish_reason": "stop", "token_ids": list(self.output),
                             "prompt_token_ids": list(prompt)}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(self.output),
                          "total_tokens": len(prompt) + len(self.output)}}


def serve_fake(state: FakeVllm):
    class H(http.server.BaseHTTPRequestHandler):
        def _send(self, status: int, body) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            state.seen.append((self.command, self.path, self.headers.get("Authorization")))
            if state.key and self.headers.get("Authorization") != f"Bearer {state.key}":
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self):
            if not self._authorized():
                return
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "served-name", "object": "model", "root": state.root,
                                                             "owned_by": "vllm", "max_model_len": 2048}]})
            elif self.path == "/version":
                self._send(200, {"version": "0.32.0"})
            elif self.path == "/metrics":
                self._send(200, state.metrics())
            elif self.path == "/server_info?config_format=json" and state.server_info is not None:
                self._send(200, {"vllm_config": {"speculative_config": state.server_info}, "vllm_env": {}})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/completions" or not all(isinstance(i, int) for i in body["prompt"]):
                self._send(400, {"error": {"message": f"{self.path}: expected a token-id prompt"}})
                return
            self._send(200, state.complete(body))

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"
