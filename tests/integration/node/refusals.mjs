// How Node clients read the gateway's refusals. `big`: openai-node sends a 5 MiB body (over
// the gateway's max_body_bytes) and must read a 413, not a connection error. `responses`: the
// AI SDK's Responses model streams from a route whose upstream cuts every stream, and must
// report the gateway's message, not a type validation failure. Prints one JSON line.
import OpenAI from "openai";
import { streamText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";

const [baseURL, check] = process.argv.slice(2);
const found = {};

if (check === "big") {
  const client = new OpenAI({ baseURL, apiKey: "x", maxRetries: 2, timeout: 30000 });
  try {
    await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "x".repeat(5 << 20) }] });
    found.big = { served: true };
  } catch (error) {
    found.big = { name: error.constructor.name, status: error.status ?? null, code: error.code ?? null };
  }
} else if (check === "responses") {
  const provider = createOpenAI({ baseURL, apiKey: "x" });
  const result = streamText({ model: provider.responses("m"), prompt: "hi", maxRetries: 0, maxOutputTokens: 40 });
  const errors = [];
  for await (const part of result.fullStream) {
    if (part.type === "error") errors.push(String(part.error?.message ?? part.error));
  }
  found.errors = errors;
}
console.log(JSON.stringify(found));
