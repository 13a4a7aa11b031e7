// The official OpenAI client library (npm `openai`) against rlfleet-gateway in front of
// a real rollout replica. Run by tools/check_openai.sh:
//   OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=KEY MODEL=NAME node check.mjs
// Prints one line per check and `openai: N passed, M failed`; exits 1 on any failure.
import OpenAI from "openai";

const baseURL = process.env.OPENAI_BASE_URL;
const apiKey = process.env.OPENAI_API_KEY;
const model = process.env.MODEL;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

let passed = 0;
let failed = 0;
function assert(condition, what) {
  if (!condition) throw new Error(`assertion failed: ${what}`);
}
async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e?.stack ?? e}`);
  }
}
async function expectError(promise, status, param) {
  try {
    await promise;
  } catch (e) {
    assert(e instanceof OpenAI.APIError, `an APIError, got ${e}`);
    assert(e.status === status, `status ${status}, got ${e.status} (${e.message})`);
    if (param !== undefined) assert(e.param === param, `param ${param}, got ${e.param}`);
    assert(typeof e.error?.message === "string" && e.error.message.length > 0, "an error message");
    return e;
  }
  throw new Error(`expected an error with status ${status}`);
}
function checkTokens(choice, usageTokens) {
  assert(Array.isArray(choice.token_ids), "token_ids");
  assert(choice.token_ids.length === choice.token_logprobs.length, "one logprob per token");
  assert(choice.token_ids.length === choice.policy_versions.length, "one policy version per token");
  assert(choice.policy_versions.every((v) => v === 1), "every token from version 1");
  assert(choice.token_logprobs.every((l) => l <= 0), "log-probabilities <= 0");
  if (usageTokens !== undefined) assert(choice.token_ids.length === usageTokens, "usage counts the tokens");
}

const messages = [
  { role: "system", content: "You add numbers." },
  { role: "user", content: "What is 2 + 3?" },
];

await check("models.list names the served model", async () => {
  const list = await client.models.list();
  assert(list.data.some((m) => m.id === model), `model ${model} listed`);
});

let greedy;
await check("chat.completions.create: text, token ids, logprobs, versions", async () => {
  greedy = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, logprobs: true });
  const c = greedy.choices[0];
  assert(greedy.object === "chat.completion", "object");
  assert(c.message.role === "assistant" && typeof c.message.content === "string", "an assistant message");
  assert(["stop", "length"].includes(c.finish_reason), `finish_reason ${c.finish_reason}`);
  checkTokens(c, greedy.usage.completion_tokens);
  assert(c.logprobs.content.length === c.token_ids.length, "a logprobs entry per token");
  assert(greedy.prompt_token_ids.length === greedy.usage.prompt_tokens, "prompt_token_ids");
});

await check("chat stream: the same greedy tokens and text, usage last", async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "";
  const ids = [];
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert(chunk.object === "chat.completion.chunk", "chunk object");
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      ids.push(...(c.token_ids ?? []));
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert(text === greedy.choices[0].message.content, `streamed text ${JSON.stringify(text)}`);
  assert(JSON.stringify(ids) === JSON.stringify(greedy.choices[0].token_ids), "streamed token ids");
  assert(finish === greedy.choices[0].finish_reason, "finish_reason");
  assert(usage && usage.completion_tokens === ids.length, "the usage chunk");
});

await check("completions.create: n=3 choices of at most max_tokens", async () => {
  const r = await client.completions.create({ model, prompt: "2 + 3 =", max_tokens: 5, n: 3, seed: 11 });
  assert(r.choices.length === 3, "3 choices");
  let total = 0;
  for (const c of r.choices) {
    assert(typeof c.text === "string", "text");
    checkTokens(c);
    assert(c.token_ids.length <= 5, "at most 5 tokens");
    total += c.token_ids.length;
  }
  assert(r.usage.completion_tokens === total, "usage");
});

await check("completions stream: text deltas add up, a stop string cuts", async () => {
  const full = await client.completions.create({ model, prompt: "Once", max_tokens: 16, temperature: 0 });
  const text = full.choices[0].text;
  const stop = text.length > 4 ? text.slice(3, 5) : null;
  const stream = await client.completions.create({ model, prompt: "Once", max_tokens: 16, temperature: 0, stream: true, ...(stop ? { stop } : {}) });
  let streamed = "";
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      streamed += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  const expected = stop ? text.slice(0, text.indexOf(stop)) : text;
  assert(streamed === expected, `streamed ${JSON.stringify(streamed)}, expected ${JSON.stringify(expected)}`);
  if (stop) assert(finish === "stop", `finish_reason stop, got ${finish}`);
});

await check("an aborted stream does not disturb the next request", async () => {
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 200, stream: true, ignore_eos: true });
  let chunks = 0;
  for await (const chunk of stream) {
    if (++chunks === 3) {
      stream.controller.abort();
      break;
    }
  }
  const r = await client.chat.completions.create({ model, messages, max_tokens: 4 });
  assert(r.choices[0].token_ids.length >= 1, "the next request is served");
});

await check("tools and an earlier tool call go through the chat template", async () => {
  const tools = [{ type: "function", function: { name: "add", description: "Adds", parameters: {
    type: "object", properties: { a: { type: "number" }, b: { type: "number" } }, required: ["a", "b"] } } }];
  const plain = await client.chat.completions.create({ model, messages, max_tokens: 2, temperature: 0 });
  const withTools = await client.chat.completions.create({ model, messages, tools, max_tokens: 2, temperature: 0 });
  assert(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 20, "the tools are in the prompt");
  const turn = await client.chat.completions.create({
    model, tools, max_tokens: 2,
    messages: [...messages,
      { role: "assistant", content: null, tool_calls: [{ id: "call_0", type: "function", function: { name: "add", arguments: "{\"a\": 2, \"b\": 3}" } }] },
      { role: "tool", tool_call_id: "call_0", content: "5" }],
  });
  assert(turn.usage.prompt_tokens > withTools.usage.prompt_tokens, "the call and its result are in the prompt");
  assert(["stop", "length", "tool_calls"].includes(turn.choices[0].finish_reason), "finish_reason");
});

await check("errors in OpenAI's shape", async () => {
  await expectError(client.chat.completions.create({ model: "no-such-model", messages }), 404, "model");
  await expectError(client.chat.completions.create({ model, messages, temperature: 5 }), 400, "temperature");
  await expectError(client.chat.completions.create({ model, messages, frequency_penalty: 1 }), 400, "frequency_penalty");
  await expectError(client.chat.completions.create({ model, messages, top_logprobs: 3, logprobs: true }), 400, "top_logprobs");
  await expectError(client.chat.completions.create({ model, messages: [] }), 400, "messages");
  await expectError(client.completions.create({ model, prompt: [1, 2, 99999999] }), 400, "prompt");
  const wrongKey = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
  const e = await expectError(wrongKey.models.list(), 401);
  assert(e.code === "invalid_api_key", "code invalid_api_key");
});

console.log(`openai: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
