"""A local stand-in for the OpenAI Chat Completions API, scripted per test.

`FakeOpenAI` listens on a free port of 127.0.0.1 and speaks the real wire format of
`POST /v1/chat/completions`:

- `stream: true` → server-sent events of `chat.completion.chunk` objects: a first chunk with
  `delta.role`, text as `delta.content` pieces, tool calls as `delta.tool_calls` (the first
  piece of each call carries its `index`, `id`, `type` and `function.name`; the `arguments`
  string follows split across several chunks), a last choice chunk with `finish_reason`
  (`stop` or `tool_calls`), then — when `stream_options.include_usage` is set — a chunk with
  empty `choices` and the `usage`, then `data: [DONE]`;
- otherwise one `chat.completion` JSON object.

Like the real API it answers 401 to a wrong key and 400 to a malformed conversation (a `tool`
message that answers no preceding tool call, an unanswered tool call, a call naming a tool the
request does not declare), so a runtime that builds a bad request fails the test.

A test scripts the model with rules (`reply(...)`): each request takes the first unused rule
whose `when` predicate accepts it (a rule without one accepts any). The reply is either a
`Text` or `ToolCalls`, or a function of the request returning one. Every request is recorded
(`requests`), so a test can assert what the model was told: tool results, a reviewer's
comment, a policy's denial. A request no rule accepts is answered with HTTP 500 and recorded in
`problems`, as is anything else a test should fail on.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "ChatRequest",
    "FakeOpenAI",
    "Text",
    "ToolCall",
    "ToolCalls",
    "after_tool",
    "all_of",
    "user_says",
]

# How many characters of a tool call's `arguments` string go into one stream chunk.
ARGUMENT_PIECE = 7


# --- What the model answers --------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """An assistant message with text only (`finish_reason: stop`)."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """One function call of the model: the tool's wire name and its arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCalls:
    """An assistant message calling tools (`finish_reason: tool_calls`), optionally after some
    text."""

    calls: tuple[ToolCall, ...]
    text: str = ""

    @classmethod
    def of(cls, *calls: tuple[str, dict[str, Any]] | ToolCall, text: str = "") -> ToolCalls:
        return cls(tuple(c if isinstance(c, ToolCall) else ToolCall(c[0], c[1]) for c in calls), text)


Reply = Text | ToolCalls


# --- What the model was told --------------------------------------------------------------------


@dataclass
class ChatRequest:
    """One recorded request: its body, headers and what the fake answered."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 0
    # The tool calls the fake answered with, `(id, name, arguments)`.
    answered_calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    answered_text: str = ""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def streaming(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def tool_names(self) -> list[str]:
        return [t.get("function", {}).get("name", "") for t in self.body.get("tools") or []]

    def user_texts(self) -> list[str]:
        return [text_of(m) for m in self.messages if m.get("role") == "user"]

    def system_text(self) -> str:
        return "\n".join(text_of(m) for m in self.messages if m.get("role") in {"system", "developer"})

    def tool_calls(self) -> list[tuple[str, str, dict[str, Any] | str]]:
        """Every tool call of the conversation so far, `(id, name, arguments)` in order (the
        arguments parsed as JSON when they are JSON)."""
        calls = []
        for m in self.messages:
            if m.get("role") != "assistant":
                continue
            for call in m.get("tool_calls") or []:
                function = call.get("function", {})
                raw = function.get("arguments", "")
                try:
                    args: dict[str, Any] | str = json.loads(raw)
                except (TypeError, ValueError):
                    args = raw
                calls.append((call.get("id", ""), function.get("name", ""), args))
        return calls

    def tool_results(self) -> list[tuple[str, str, str]]:
        """Every tool outcome the model was given, `(tool name, call id, content)` in order."""
        names = {call_id: name for call_id, name, _ in self.tool_calls()}
        return [
            (names.get(m.get("tool_call_id", ""), ""), m.get("tool_call_id", ""), text_of(m))
            for m in self.messages
            if m.get("role") == "tool"
        ]

    def results_of(self, tool: str) -> list[str]:
        """The contents of the outcomes of calls to `tool`, in order."""
        return [content for name, _, content in self.tool_results() if name == tool]

    def last_message(self) -> dict[str, Any]:
        return self.messages[-1] if self.messages else {}


def text_of(message: dict[str, Any]) -> str:
    """A message's content as text (string content, or the text parts of an array)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


# --- Predicates for `when` ----------------------------------------------------------------------

Predicate = Callable[[ChatRequest], bool]


def user_says(fragment: str) -> Predicate:
    """The conversation's first user message contains `fragment` (identifies a session)."""

    def check(request: ChatRequest) -> bool:
        texts = request.user_texts()
        return bool(texts) and fragment in texts[0]

    return check


def after_tool(name: str, count: int = 1) -> Predicate:
    """The conversation ends with outcomes of tool calls, and the model has now been given
    `count` outcomes of calls to `name` in total."""

    def check(request: ChatRequest) -> bool:
        return request.last_message().get("role") == "tool" and len(request.results_of(name)) == count

    return check


def all_of(*predicates: Predicate) -> Predicate:
    return lambda request: all(p(request) for p in predicates)


# --- The server ---------------------------------------------------------------------------------


@dataclass
class _Rule:
    reply: Reply | Callable[[ChatRequest], Reply]
    when: Predicate | None
    label: str
    used: bool = False


class _ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "server_error",
                "param": param,
                "code": code,
            }
        }


class FakeOpenAI:
    """The fake API; use as a context manager or call `start()` / `stop()`."""

    def __init__(self, api_key: str = "sk-test-fake-openai") -> None:
        self.api_key = api_key
        self.requests: list[ChatRequest] = []
        self.problems: list[str] = []
        self._rules: list[_Rule] = []
        self._lock = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # Lifecycle

    def start(self) -> FakeOpenAI:
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """The API root, as `OPENAI_BASE_URL` takes it."""
        assert self._server is not None, "start the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    # Scripting

    def reply(
        self,
        reply: Reply | Callable[[ChatRequest], Reply],
        when: Predicate | None = None,
        label: str = "",
    ) -> None:
        """Adds a rule: the next request `when` accepts gets `reply` (once)."""
        with self._lock:
            self._rules.append(_Rule(reply, when, label or repr(reply)))

    def unused_rules(self) -> list[str]:
        with self._lock:
            return [r.label for r in self._rules if not r.used]

    # Observation

    def wait_for(self, predicate: Predicate, what: str, timeout: float = 60.0) -> ChatRequest:
        """The first recorded request `predicate` accepts, waiting for it to arrive."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for request in self.requests:
                    if predicate(request):
                        return request
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"the model never received {what}; requests so far:\n"
                        + "\n".join(json.dumps(r.messages)[:2000] for r in self.requests)
                        + ("\nproblems:\n" + "\n".join(self.problems) if self.problems else "")
                    )
                self._lock.wait(remaining)

    def requests_where(self, predicate: Predicate) -> list[ChatRequest]:
        with self._lock:
            return [r for r in self.requests if predicate(r)]

    # Serving (called on the server's threads)

    def _answer(self, request: ChatRequest) -> Reply:
        with self._lock:
            try:
                self._check_auth(request)
                self._check_body(request)
                for rule in self._rules:
                    if not rule.used and (rule.when is None or rule.when(request)):
                        rule.used = True
                        reply = rule.reply(request) if callable(rule.reply) else rule.reply
                        self._check_reply(request, reply, rule.label)
                        return reply
                problem = "no scripted reply for a request whose conversation is " + json.dumps(
                    request.messages
                )
                self.problems.append(problem)
                raise _ApiError(500, f"fake_openai: {problem}")
            finally:
                self.requests.append(request)
                self._lock.notify_all()

    def _check_auth(self, request: ChatRequest) -> None:
        header = request.headers.get("authorization", "")
        if header != f"Bearer {self.api_key}":
            self.problems.append(f"request with Authorization {header[:20]!r}…")
            raise _ApiError(
                401,
                "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
                code="invalid_api_key",
            )

    def _check_body(self, request: ChatRequest) -> None:
        body = request.body
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise _ApiError(400, "you must provide a model parameter", param="model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _ApiError(400, "[] is too short - 'messages'", param="messages")
        declared = set()
        for i, tool in enumerate(body.get("tools") or []):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
                raise _ApiError(400, f"Invalid value for 'tools[{i}]'", param=f"tools[{i}]")
            if not function.get("name"):
                raise _ApiError(400, f"Missing required parameter: 'tools[{i}].function.name'.")
            declared.add(function["name"])
        # Tool calls must be answered, each by one `tool` message, before the conversation goes on.
        open_calls: set[str] = set()
        for i, m in enumerate(messages):
            role = m.get("role") if isinstance(m, dict) else None
            if role not in {"system", "developer", "user", "assistant", "tool"}:
                raise _ApiError(400, f"Invalid value: '{role}'", param=f"messages[{i}].role")
            if role == "tool":
                call_id = m.get("tool_call_id")
                if call_id not in open_calls:
                    raise _ApiError(
                        400,
                        "Invalid parameter: messages with role 'tool' must be a response to a "
                        "preceeding message with 'tool_calls'.",
                        param=f"messages.[{i}].role",
                    )
                open_calls.discard(call_id)
                continue
            if open_calls:
                raise _ApiError(
                    400,
                    "An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                    f"response messages: {', '.join(sorted(open_calls))}",
                    param="messages",
                )
            if role == "assistant":
                for call in m.get("tool_calls") or []:
                    if not call.get("id"):
                        raise _ApiError(400, "Missing required parameter: 'tool_calls[].id'.")
                    if len(call["id"]) > 64:
                        raise _ApiError(400, "Invalid 'tool_calls[].id': string too long.")
                    name = call.get("function", {}).get("name", "")
                    if declared and name not in declared:
                        self.problems.append(f"the conversation calls an undeclared tool {name!r}")
                    open_calls.add(call["id"])
        if open_calls:
            raise _ApiError(
                400,
                "An assistant message with 'tool_calls' must be followed by tool messages responding "
                f"to each 'tool_call_id'. The following tool_call_ids did not have response "
                f"messages: {', '.join(sorted(open_calls))}",
                param="messages",
            )

    def _check_reply(self, request: ChatRequest, reply: Reply, label: str) -> None:
        if isinstance(reply, ToolCalls):
            missing = [c.name for c in reply.calls if c.name not in request.tool_names]
            if missing:
                self.problems.append(f"rule {label} calls {missing}, not among the request's tools {request.tool_names}")
                raise _ApiError(500, f"fake_openai: rule {label} calls undeclared tools {missing}")


def _estimate_tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def _pieces(text: str, size: int) -> Iterable[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _words(text: str) -> Iterable[str]:
    """Text split into streaming deltas (each word with its following space)."""
    piece = ""
    for ch in text:
        piece += ch
        if ch == " ":
            yield piece
            piece = ""
    if piece:
        yield piece


class _Handler(BaseHTTPRequestHandler):
    owner: FakeOpenAI
    protocol_version = "HTTP/1.1"
    server_version = "fake-openai/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._send_json(404, _ApiError(404, f"Invalid URL (GET {self.path})").body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        raw = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, _ApiError(404, f"Invalid URL (POST {self.path})").body)
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as error:
            self._send_json(400, _ApiError(400, f"We could not parse the JSON body of your request. ({error})").body)
            return
        request = ChatRequest(path=self.path, headers=headers, body=body)
        try:
            reply = self.owner._answer(request)
        except _ApiError as error:
            request.status = error.status
            self._send_json(error.status, error.body)
            return
        request.status = 200
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        calls = []
        if isinstance(reply, ToolCalls):
            calls = [("call_" + secrets.token_urlsafe(18)[:24], c.name, c.arguments) for c in reply.calls]
        request.answered_calls = calls
        request.answered_text = reply.text
        prompt_tokens = _estimate_tokens(json.dumps(body.get("messages")))
        completion_tokens = _estimate_tokens(reply.text + "".join(json.dumps(c[2]) for c in calls))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        }
        finish = "tool_calls" if calls else "stop"
        model = body["model"]
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(completion_id, model, reply.text, calls, finish, usage if include_usage else None)
        else:
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
            if calls:
                message["tool_calls"] = [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                    for cid, name, args in calls
                ]
            self._send_json(
                200,
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                    "usage": usage,
                    "system_fingerprint": "fp_fake",
                },
            )

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers (if any) end with an empty line.
                    while self.rfile.readline().strip():
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(
        self,
        completion_id: str,
        model: str,
        text: str,
        calls: list[tuple[str, str, dict[str, Any]]],
        finish: str,
        usage: dict[str, Any] | None,
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        created = int(time.time())

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> None:
            event = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": choices,
            }
            if usage is not None:
                event["usage"] = None
            event.update(extra)
            self._write_event(json.dumps(event))

        def delta(d: dict[str, Any], finish_reason: str | None = None) -> None:
            chunk([{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish_reason}])

        delta({"role": "assistant", "content": "", "refusal": None})
        for word in _words(text):
            delta({"content": word})
        for index, (call_id, name, args) in enumerate(calls):
            delta(
                {
                    "tool_calls": [
                        {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
                    ]
                }
            )
            for piece in _pieces(json.dumps(args), ARGUMENT_PIECE):
                delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        delta({}, finish)
        if usage is not None:
            chunk([], usage=usage)
        self._write_event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _write_event(self, data: str) -> None:
        payload = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.wfile.flush()

