// openai-node 5.x through tidegate: runTools, responses.stream and embeddings.create with the
// SDK's defaults (base64). Prints one JSON line of findings; exits non-zero on any failure.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "x", maxRetries: 0, timeout: 30000 });
const found = {};

const runner = client.chat.completions.runTools({
  model: "m",
  messages: [{ role: "user", content: "weather in Paris?" }],
  tools: [
    {
      type: "function",
      function: {
        name: "get_weather",
        parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
        function: (args) => {
          found.toolArgs = args;
          return "sunny";
        },
        parse: JSON.parse,
      },
    },
  ],
});
found.runToolsAnswer = await runner.finalContent();
found.runToolsCalls = (await runner.allChatCompletions()).length;

const events = [];
const stream = client.responses.stream({ model: "m", input: "hi", max_output_tokens: 5 });
for await (const event of stream) events.push(event.type);
const response = await stream.finalResponse();
found.responsesEvents = events;
found.responsesText = response.output
  .flatMap((item) => item.content ?? [])
  .map((part) => part.text ?? "")
  .join("");

const embedded = await client.embeddings.create({ model: "m", input: ["a", "b"], dimensions: 6 });
found.embeddingLengths = embedded.data.map((d) => d.embedding.length);
found.embeddingIsNumbers = embedded.data.every((d) => d.embedding.every((x) => typeof x === "number"));

console.log(JSON.stringify(found));
