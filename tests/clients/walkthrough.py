"""The README's walkthrough through a Python client generated from the served
OpenAPI document by openapi-python-client (scripts/test-clients.sh generates
it as the package `engram_client`):

    python walkthrough.py BASE_URL API_KEY

Undocumented statuses raise (raise_on_unexpected_status), and every answer
is parsed into the generated models, so a response that breaks the document
fails here.
"""

import sys
import uuid

from engram_client import AuthenticatedClient
from engram_client.api.memories import create_memories, delete_memory, get_memory, list_memories, update_memory
from engram_client.api.recall import build_context, search_memories
from engram_client.models import (
    BatchRequest,
    ContextRequest,
    CreateMemoryRequest,
    CreateMemoryRequestMetadataType0,
    ErrorBody,
    EventType,
    ListResponse,
    MemoryResponse,
    Outcome,
    SearchRequest,
    Tier,
    UpdateMemoryRequest,
    WriteResponse,
)

BASE, KEY = sys.argv[1], sys.argv[2]
AGENT = f"travel-bot-{uuid.uuid4().hex[:8]}"


def check(condition, what, detail=None):
    if not condition:
        raise AssertionError(f"{what}: {detail!r}" if detail is not None else what)
    print(f"ok  {what}")


client = AuthenticatedClient(base_url=BASE, token=KEY, raise_on_unexpected_status=True)

# Write one memory of each tier (a batch is all or nothing).
metadata = CreateMemoryRequestMetadataType0.from_dict({"channel": "chat"})
batch = BatchRequest(
    memories=[
        CreateMemoryRequest(agent_id=AGENT, session_id="s1", tier=Tier.WORKING,
                            content="User is comparing flights to Lisbon"),
        CreateMemoryRequest(agent_id=AGENT, user_id="u42", content="Booked TAP flight TP123 for 3 June",
                            event_type=EventType.ACTION, outcome=Outcome.SUCCESS, metadata=metadata),
        CreateMemoryRequest(agent_id=AGENT, user_id="u42", content="The user prefers aisle seats",
                            subject="user", predicate="seat", confidence=0.9),
        CreateMemoryRequest(agent_id=AGENT, skill_name="book_flight",
                            content="Search, filter by price, confirm with the user", outcome=Outcome.SUCCESS),
    ]
)
response = create_memories.sync_detailed(client=client, body=batch)
written = response.parsed
check(response.status_code == 201 and isinstance(written, WriteResponse), "write a batch", response.status_code)
tiers = [m.tier for m in written.memories]
check(tiers == [Tier.WORKING, Tier.EPISODIC, Tier.SEMANTIC, Tier.PROCEDURAL], "one memory of each tier", tiers)
episode, fact = written.memories[1], written.memories[2]

# Read one back.
memory = get_memory.sync(id=episode.id, client=client)
check(isinstance(memory, MemoryResponse) and memory.content == episode.content, "read it back")
check(memory.metadata.to_dict() == {"channel": "chat"}, "with its metadata", memory.metadata.to_dict())

# List the agent's memories, two per page, following next_cursor.
seen, cursor = [], None
while True:
    page = list_memories.sync(client=client, agent_id=AGENT, limit=2, **({"cursor": cursor} if cursor else {}))
    check(isinstance(page, ListResponse) and len(page.memories) <= 2, "a page of at most two")
    seen += [m.id for m in page.memories]
    cursor = page.next_cursor
    if not cursor:
        break
check(len(seen) == 3 and len(set(seen)) == 3, "the cursor walks the three persistent memories", len(seen))
page = list_memories.sync(client=client, agent_id=AGENT, session_id="s1", tier="working")
check([m.content for m in page.memories] == ["User is comparing flights to Lisbon"], "the session's working memory")

# Update.
updated = update_memory.sync(id=episode.id, client=client, body=UpdateMemoryRequest(importance=0.9))
check(isinstance(updated, MemoryResponse) and updated.importance == 0.9, "update", updated)

# Search, scored and explained.
body = SearchRequest(agent_id=AGENT, session_id="s1", query="which seat does the user like?", top_k=5)
found = search_memories.sync(client=client, body=body)
check(found.results and found.results[0].memory.id == fact.id, "search ranks the seat fact first",
      [r.memory.content for r in found.results])
check(0 < found.results[0].components.relevance <= 1, "with the score's parts", found.results[0].components)

# A context block within a token budget.
context = build_context.sync(client=client, body=ContextRequest(agent_id=AGENT, session_id="s1",
                                                                query="book a flight", max_context_tokens=8000))
check("aisle" in context.context or "TP123" in context.context, "context", context.context)
check(context.usage.tokens_used <= context.usage.tokens_available, "within its budget")

# Delete, then the memory is gone.
response = delete_memory.sync_detailed(id=episode.id, client=client)
check(response.status_code == 204, "delete", response.status_code)

# One error: the typed error body names the field.
response = get_memory.sync_detailed(id=episode.id, client=client)
check(response.status_code == 404 and isinstance(response.parsed, ErrorBody), "a deleted memory is 404")
check(response.parsed.error.code == "memory_not_found", "with its code", response.parsed.error.code)
bad = CreateMemoryRequest(agent_id=AGENT, content="x", importance=7)
response = create_memories.sync_detailed(client=client, body=bad)
check(response.status_code == 422 and response.parsed.error.field == "/importance", "a bad field is 422 naming it",
      response.parsed)
print("walkthrough.py: all checks passed")
