// The README's walkthrough through a TypeScript client: types generated from
// the served OpenAPI document by openapi-typescript (`engram.ts`, written by
// scripts/test-clients.sh), requests made by openapi-fetch. The file is
// type-checked against the generated types before it runs, so a document
// that changes a field's name or type fails at compile time.
//
//   node build/walkthrough.js BASE_URL API_KEY

import createClient from "openapi-fetch";
import type { components, paths } from "./engram.js";

type Memory = components["schemas"]["MemoryResponse"];

const [base, key] = process.argv.slice(2);
if (!base || !key) throw new Error("usage: walkthrough.js BASE_URL API_KEY");
const client = createClient<paths>({ baseUrl: base, headers: { Authorization: `Bearer ${key}` } });
const agent = `travel-bot-${crypto.randomUUID().slice(0, 8)}`;

function check(condition: unknown, what: string, detail?: unknown): asserts condition {
  if (!condition) throw new Error(`${what}: ${JSON.stringify(detail)}`);
  console.log(`ok  ${what}`);
}

// Write one memory of each tier (a batch is all or nothing).
const written = await client.POST("/v1/memories", {
  body: {
    memories: [
      { agent_id: agent, session_id: "s1", tier: "working", content: "User is comparing flights to Lisbon" },
      {
        agent_id: agent,
        user_id: "u42",
        content: "Booked TAP flight TP123 for 3 June",
        event_type: "action",
        outcome: "success",
        metadata: { channel: "chat" },
      },
      { agent_id: agent, user_id: "u42", content: "The user prefers aisle seats", subject: "user", predicate: "seat", confidence: 0.9 },
      { agent_id: agent, skill_name: "book_flight", content: "Search, filter by price, confirm with the user", outcome: "success" },
    ],
  },
});
check(written.response.status === 201 && written.data, "write a batch", written.error);
const tiers = written.data.memories.map((m) => m.tier);
check(JSON.stringify(tiers) === JSON.stringify(["working", "episodic", "semantic", "procedural"]), "one memory of each tier", tiers);
const episode = written.data.memories[1];
const fact = written.data.memories[2];
check(episode && fact, "the episode and the fact");

// Read one back.
const read = await client.GET("/v1/memories/{id}", { params: { path: { id: episode.id } } });
check(read.data?.content === episode.content, "read it back", read.error);
check(read.data.metadata["channel"] === "chat", "with its metadata", read.data.metadata);

// List the agent's memories, two per page, following next_cursor.
const seen: Memory["id"][] = [];
let cursor: string | undefined;
do {
  const page = await client.GET("/v1/memories", { params: { query: { agent_id: agent, limit: 2, cursor } } });
  check(page.data && page.data.memories.length <= 2, "a page of at most two", page.error);
  seen.push(...page.data.memories.map((m) => m.id));
  cursor = page.data.next_cursor ?? undefined;
} while (cursor);
check(seen.length === 3 && new Set(seen).size === 3, "the cursor walks the three persistent memories", seen);
const session = await client.GET("/v1/memories", { params: { query: { agent_id: agent, session_id: "s1", tier: "working" } } });
check(session.data?.memories[0]?.content === "User is comparing flights to Lisbon", "the session's working memory", session.data);

// Update.
const updated = await client.PATCH("/v1/memories/{id}", { params: { path: { id: episode.id } }, body: { importance: 0.9 } });
check(updated.data?.importance === 0.9, "update", updated.error);

// Search, scored and explained.
const found = await client.POST("/v1/memories/search", {
  body: { agent_id: agent, session_id: "s1", query: "which seat does the user like?", top_k: 5 },
});
const best = found.data?.results[0];
check(best?.memory.id === fact.id, "search ranks the seat fact first", found.data?.results.map((r) => r.memory.content));
check(best.components.relevance > 0 && best.components.relevance <= 1, "with the score's parts", best.components);

// A context block within a token budget.
const context = await client.POST("/v1/context", {
  body: { agent_id: agent, session_id: "s1", query: "book a flight", max_context_tokens: 8000 },
});
check(context.data && /aisle|TP123/.test(context.data.context), "context", context.error);
check(context.data.usage.tokens_used <= context.data.usage.tokens_available, "within its budget", context.data.usage);

// Delete, then the memory is gone.
const deleted = await client.DELETE("/v1/memories/{id}", { params: { path: { id: episode.id } } });
check(deleted.response.status === 204, "delete", deleted.response.status);

// One error: the typed error body names the code and the field.
const gone = await client.GET("/v1/memories/{id}", { params: { path: { id: episode.id } } });
check(gone.response.status === 404 && gone.error?.error.code === "memory_not_found", "a deleted memory is 404", gone.error);
const bad = await client.POST("/v1/memories", { body: { agent_id: agent, content: "x", importance: 7 } });
check(bad.response.status === 422 && bad.error?.error.field === "/importance", "a bad field is 422 naming it", bad.error);
console.log("walkthrough.ts: all checks passed");
