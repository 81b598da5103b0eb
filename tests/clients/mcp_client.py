"""Drives engram's MCP tools with the official MCP Python SDK, as an agent's
MCP client would: over Streamable HTTP (`/mcp`, both the 2026-07-28
protocol and the older initialize handshake) and over stdio (`engram mcp`,
on its own store and forwarding to the server).

    python mcp_client.py BASE_URL ENGRAM_BIN

The server at BASE_URL has these keys (scripts/test-clients.sh): tenant
`acme` with `acme-rw` (read_write), `acme-ro` (read) and `acme-admin`
(admin), tenant `globex` with `globex-rw`. Exits non-zero on the first
failed check.
"""

import asyncio
import json
import os
import sys
import tempfile
import uuid

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

BASE = sys.argv[1].rstrip("/")
BIN = sys.argv[2]
AGENT = f"mcp-agent-{uuid.uuid4().hex[:8]}"
TOOLS = {"remember", "recall", "context", "forget"}


def http_client(key, mode="auto"):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    transport = streamable_http_client(f"{BASE}/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=30))
    return Client(transport, mode=mode)


def check(condition, what, detail=None):
    if not condition:
        raise AssertionError(f"{what}: {detail!r}" if detail is not None else what)
    print(f"ok  {what}")


def error_of(result):
    """The error object of a tool error (structured content), or None."""
    if not result.is_error:
        return None
    return (result.structured_content or {}).get("error", {})


async def call(client, tool, arguments):
    return await client.call_tool(tool, arguments)


async def remember(client, **memory):
    result = await call(client, "remember", {"agent_id": AGENT, **memory})
    check(not result.is_error, f"remember {memory.get('content', '')[:40]!r}", result.content)
    return result.structured_content


async def tools_are_listed(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    check(set(tools) == TOOLS, "the four tools are listed", sorted(tools))
    for tool in tools.values():
        schema = tool.input_schema
        check(schema.get("type") == "object" and "$ref" not in json.dumps(schema), f"{tool.name}: a self-contained schema")
        check(len(tool.description or "") > 80, f"{tool.name}: a description a model can act on")
    check("max_tokens" in tools["context"].input_schema["properties"], "context takes max_tokens")
    check(tools["recall"].annotations.read_only_hint is True, "recall is marked read-only")
    check(tools["forget"].annotations.destructive_hint is True, "forget is marked destructive")


async def main_flow(rw, ro, admin, other):
    """Every tool, its bad arguments, scopes and tenants, on one protocol."""
    await tools_are_listed(rw)
    facts = [
        "Alice works night shifts as a nurse.",
        "Alice is allergic to peanuts.",
        "Alice lives in Lisbon with her two cats.",
        "Bob is a carpenter who builds boats.",
    ]
    written = [await remember(rw, content=f, tier="semantic", user_id="alice") for f in facts]
    nurse = written[0]
    check(nurse["tier"] == "semantic" and uuid.UUID(nurse["id"]), "remember answers the stored memory", nurse)
    inferred = await remember(rw, content="Yesterday Alice asked how to renew her passport.")
    check(inferred["tier"] in {"episodic", "semantic"}, "remember infers a tier", inferred["tier"])
    again = await remember(rw, content=facts[0], tier="semantic", user_id="alice")
    check(again["deduplicated"] is True and again["id"] == nurse["id"], "an identical fact is not stored twice")

    # recall: best first, with the score's parts.
    result = await call(rw, "recall", {"agent_id": AGENT, "query": "What is Alice's job?", "top_k": 3})
    check(not result.is_error, "recall answers", result.content)
    results = result.structured_content["results"]
    check(results and "nurse" in results[0]["memory"]["content"], "recall ranks the right fact first", results[:1])
    components = results[0]["components"]
    check({"relevance", "recency", "importance"} <= set(components), "recall gives the score breakdown", components)
    check("nurse" in result.content[0].text, "recall's text content carries the results")

    # context: a block within max_tokens.
    result = await call(rw, "context", {"agent_id": AGENT, "query": "Tell me about Alice's job", "max_tokens": 200})
    check(not result.is_error, "context answers", result.content)
    check("nurse" in result.content[0].text, "context's text is the block", result.content[0].text)
    usage = result.structured_content["usage"]
    check(0 < usage["tokens_used"] <= 200, "context keeps to max_tokens", usage)

    # Bad arguments: tool errors naming the field, in the REST API's codes.
    bad = [
        ("recall", {"agent_id": AGENT, "query": "x", "top_k": "ten"}, "/top_k"),
        ("recall", {"agent_id": AGENT, "query": "   "}, "/query"),
        ("recall", {"agent_id": AGENT, "query": "x", "colour": "red"}, "/colour"),
        ("remember", {"agent_id": AGENT}, "/content"),
        ("remember", {"agent_id": AGENT, "content": "x", "importance": 7}, "/importance"),
        ("remember", {"agent_id": AGENT, "content": "scratch", "tier": "working"}, "/session_id"),
        ("context", {"agent_id": AGENT, "query": "x"}, "/max_tokens"),
        ("context", {"agent_id": AGENT, "query": "x", "max_tokens": 0}, "/max_tokens"),
        ("context", {"agent_id": AGENT, "query": "x", "max_tokens": 50, "max_context_tokens": 9}, "/max_context_tokens"),
        ("forget", {}, "/memory_id"),
        ("forget", {"memory_id": "not-a-uuid"}, "/memory_id"),
        ("forget", {"memory_id": nurse["id"], "user_id": "alice"}, "/memory_id"),
    ]
    for tool, arguments, field in bad:
        result = await call(rw, tool, arguments)
        error = error_of(result)
        check(
            error is not None and error.get("code") == "invalid_field" and error.get("field") == field,
            f"{tool} {json.dumps(arguments)[:60]} is a tool error naming {field}",
            error,
        )
        check(field in result.content[0].text, f"{tool}: the error text names {field}", result.content[0].text)
    try:
        await call(rw, "summarise", {})
        check(False, "an unknown tool is a protocol error")
    except MCPError as e:
        check(True, f"an unknown tool is a protocol error ({e})")

    # Scopes: a read key recalls but cannot write or forget.
    result = await call(ro, "recall", {"agent_id": AGENT, "query": "Alice"})
    check(not result.is_error and result.structured_content["results"], "a read key recalls")
    for tool, arguments in [("remember", {"agent_id": AGENT, "content": "x"}), ("forget", {"memory_id": nurse["id"]})]:
        error = error_of(await call(ro, tool, arguments))
        check(error and error["code"] == "insufficient_scope", f"a read key cannot {tool}", error)

    # Tenants: the other tenant's key sees nothing of this one's.
    result = await call(other, "recall", {"agent_id": AGENT, "query": "Alice nurse"})
    check(not result.is_error and result.structured_content["results"] == [], "another tenant recalls nothing")
    result = await call(other, "context", {"agent_id": AGENT, "query": "Alice nurse", "max_tokens": 200})
    check(not result.is_error and "nurse" not in result.content[0].text, "another tenant's context is empty")
    error = error_of(await call(other, "forget", {"memory_id": nurse["id"]}))
    check(error and error["code"] == "memory_not_found", "another tenant cannot forget it", error)
    read = await other.read_resource(f"engram://agents/{AGENT}/memories")
    check(json.loads(read.contents[0].text)["memories"] == [], "another tenant's resource is empty")

    # Resources: the agent's recent memories.
    templates = (await rw.list_resource_templates()).resource_templates
    check([t.uri_template for t in templates] == ["engram://agents/{agent_id}/memories"], "the resource template is listed")
    read = await rw.read_resource(f"engram://agents/{AGENT}/memories")
    contents = [m["content"] for m in json.loads(read.contents[0].text)["memories"]]
    check(facts[0] in contents and len(contents) == len(facts) + 1, "the resource lists the agent's memories", contents)
    try:
        await rw.read_resource("engram://nothing/here")
        check(False, "an unknown resource is an error")
    except MCPError as e:
        check(True, f"an unknown resource is an error ({e})")

    # forget: one memory, then a whole user (an admin key's erasure).
    result = await call(rw, "forget", {"memory_id": written[3]["id"]})
    check(not result.is_error and result.structured_content["deleted"] == written[3]["id"], "forget deletes a memory")
    error = error_of(await call(rw, "forget", {"memory_id": written[3]["id"]}))
    check(error and error["code"] == "memory_not_found", "a forgotten memory is gone", error)
    error = error_of(await call(rw, "forget", {"user_id": "alice"}))
    check(error and error["code"] == "insufficient_scope", "erasing a user needs an admin key", error)
    result = await call(admin, "forget", {"user_id": "alice", "agent_id": AGENT})
    check(not result.is_error and result.structured_content["state"] in {"pending", "running", "completed"},
          "an admin key erases a user", result.content)
    for _ in range(100):
        result = await call(rw, "recall", {"agent_id": AGENT, "query": "Alice", "user_id": "alice"})
        if not any(r["memory"].get("user_id") == "alice" for r in result.structured_content["results"]):
            break
        await asyncio.sleep(0.2)
    left = [r["memory"]["content"] for r in result.structured_content["results"] if r["memory"].get("user_id") == "alice"]
    check(left == [], "after the erasure nothing of the user is recalled", left)


async def without_key():
    async with httpx2.AsyncClient() as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        response = await http.post(f"{BASE}/mcp", json=body, headers={"Accept": "application/json, text/event-stream"})
        check(response.status_code == 401, "/mcp without a key is 401", response.status_code)
        check(response.headers.get("www-authenticate", "").lower().startswith("bearer"), "with its challenge")
        response = await http.post(f"{BASE}/mcp", json=body, headers={"Authorization": "Bearer wrong"})
        check(response.status_code == 401, "/mcp with an unknown key is 401", response.status_code)


async def legacy_handshake():
    """Clients of the initialize-handshake protocols work too."""
    async with http_client("acme-rw", mode="legacy") as client:
        check(client.protocol_version < "2026-07-28", "legacy handshake negotiated", client.protocol_version)
        await tools_are_listed(client)
        stored = (await call(client, "remember", {"agent_id": AGENT, "content": "Carol plays the cello."})).structured_content
        result = await call(client, "recall", {"agent_id": AGENT, "query": "Who plays the cello?", "top_k": 1})
        check(result.structured_content["results"][0]["memory"]["id"] == stored["id"], "legacy: remember then recall")


async def stdio_on_own_store():
    """`engram mcp` as a desktop client starts it: its own embedded store."""
    with tempfile.TemporaryDirectory() as data:
        # The same model as the server's (ENGRAM_MODEL_DIR), nothing else of its settings.
        env = {k: v for k, v in os.environ.items()
               if k == "ENGRAM_MODEL_DIR" or not k.startswith(("ENGRAM_", "DATABASE_URL", "REDIS_URL"))}
        env.update(ENGRAM_DATA_DIR=data, ENGRAM_LOG__FILTER="warn")
        async with Client(StdioServerParameters(command=BIN, args=["mcp"], env=env)) as client:
            await tools_are_listed(client)
            stored = (await call(client, "remember", {"agent_id": "desk", "content": "Dana's favourite tea is sencha.",
                                                      "tier": "semantic"})).structured_content
            result = await call(client, "recall", {"agent_id": "desk", "query": "Which tea does Dana like?"})
            check(result.structured_content["results"][0]["memory"]["id"] == stored["id"], "stdio: remember then recall")
            result = await call(client, "context", {"agent_id": "desk", "query": "tea", "max_tokens": 100})
            check("sencha" in result.content[0].text, "stdio: context")
            error = error_of(await call(client, "recall", {"agent_id": "desk", "query": ""}))
            check(error and error["field"] == "/query", "stdio: bad arguments are tool errors", error)
            result = await call(client, "forget", {"memory_id": stored["id"]})
            check(not result.is_error, "stdio: forget")
        # The store outlives the process: the forgotten memory stays forgotten.
        async with Client(StdioServerParameters(command=BIN, args=["mcp"], env=env)) as client:
            result = await call(client, "recall", {"agent_id": "desk", "query": "tea"})
            check(result.structured_content["results"] == [], "stdio: forgotten across restarts")


async def stdio_forwarding():
    """`engram mcp --url`: stdio in front of a running server, with a key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(ENGRAM_API_KEY="globex-rw", ENGRAM_LOG__FILTER="warn")
    params = StdioServerParameters(command=BIN, args=["mcp", "--url", BASE], env=env)
    async with Client(params) as client:
        await call(client, "remember", {"agent_id": AGENT, "content": "Globex ships anvils on Tuesdays."})
        result = await call(client, "recall", {"agent_id": AGENT, "query": "When are anvils shipped?"})
        contents = [r["memory"]["content"] for r in result.structured_content["results"]]
        check(contents and "anvils" in contents[0], "stdio --url: its key's tenant", contents)
        check(not any("Carol" in c or "Alice" in c for c in contents), "stdio --url: not another tenant's", contents)


async def main():
    await without_key()
    async with http_client("acme-rw") as rw, http_client("acme-ro") as ro, http_client("acme-admin") as admin, \
            http_client("globex-rw") as other:
        check(rw.protocol_version == "2026-07-28", "the current protocol negotiated", rw.protocol_version)
        await main_flow(rw, ro, admin, other)
    await legacy_handshake()
    await stdio_on_own_store()
    await stdio_forwarding()
    print("mcp_client.py: all checks passed")


if __name__ == "__main__":
    asyncio.run(main())
