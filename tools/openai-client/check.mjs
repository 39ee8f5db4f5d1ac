// Drives a running `k3 serve` with the official openai npm client, the way
// an application would. .ci/run starts the server and runs this with
// K3_URL (the server's base URL) and K3_API_KEY set. Each check throws on a
// wrong answer; the process exits non-zero on the first failure.
import assert from "node:assert/strict";
import OpenAI from "openai";
import { VERSION } from "openai/version";

const base = process.env.K3_URL ?? "http://127.0.0.1:8080";
const apiKey = process.env.K3_API_KEY ?? "none";
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 60_000 });
const messages = [
  { role: "system", content: "You complete Go code." },
  { role: "user", content: "func main() {" },
];

// spells reports whether the pieces (token strings) joined give text. A
// character the tokenizer split over tokens shows as U+FFFD in each piece
// (docs/SERVING.md), so only pieces without one are held to it.
function spells(pieces, text) {
  return pieces.some((p) => p.includes("\uFFFD")) || pieces.join("") === text;
}

// bytesSpell reports whether the entries' bytes, joined, decode to text,
// where they decode at all (a model may write bytes that are no UTF-8).
function bytesSpell(entries, text) {
  let decoded;
  try {
    decoded = new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(entries.flatMap((e) => e.bytes)));
  } catch {
    return true;
  }
  return decoded === text;
}

async function metric(name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(name + "{") || l.startsWith(name + " "));
  assert.ok(line, `no ${name} in /metrics`);
  return Number(line.slice(line.lastIndexOf(" ") + 1));
}

const checks = {
  async models() {
    const list = await client.models.list();
    assert.ok(list.data.length === 1, "one model listed");
    return list.data[0].id;
  },

  async chat(model) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
    const c = r.choices[0];
    assert.equal(c.message.role, "assistant");
    assert.equal(typeof c.message.content, "string");
    assert.ok(["stop", "length"].includes(c.finish_reason), c.finish_reason);
    assert.ok(r.usage.completion_tokens > 0 && r.usage.prompt_tokens > 0);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    return c.message.content;
  },

  async stream(model, whole) {
    const stream = await client.chat.completions.create({
      model, messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let text = "", finish = null, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.delta.content ?? "";
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(text, whole, "the stream's text is the greedy whole answer's");
    assert.ok(finish, "a finish_reason");
    assert.ok(usage && usage.completion_tokens > 0, "the usage chunk");
  },

  async stop(model, whole) {
    // A stop string the greedy answer is known to contain.
    const cut = whole.length >= 8 ? whole.slice(4, 7) : whole.slice(0, 1);
    assert.ok(cut.length > 0, `answer too short to cut: ${JSON.stringify(whole)}`);
    const r = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stop: [cut] });
    assert.equal(r.choices[0].message.content, whole.slice(0, whole.indexOf(cut)));
    assert.equal(r.choices[0].finish_reason, "stop");
  },

  async logprobs(model) {
    const r = await client.chat.completions.create({
      model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3,
    });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens);
    for (const t of content) {
      assert.ok(t.logprob <= 0, `logprob ${t.logprob}`);
      assert.equal(t.top_logprobs.length, 3);
      assert.ok(t.top_logprobs[0].logprob >= t.logprob, "the top alternative is at least as likely");
      assert.ok(Array.isArray(t.bytes));
    }
    assert.ok(bytesSpell(content, r.choices[0].message.content), "the tokens' bytes spell the answer");
  },

  async completions(model) {
    const r = await client.completions.create({ model, prompt: "package main\n\nimport \"", max_tokens: 8, temperature: 0, logprobs: 2 });
    const c = r.choices[0];
    assert.equal(typeof c.text, "string");
    assert.equal(c.logprobs.tokens.length, r.usage.completion_tokens);
    assert.ok(spells(c.logprobs.tokens, c.text), "the tokens spell the text");
    // text_offset: the characters (code points) of the tokens before.
    c.logprobs.tokens.forEach((_, i) => {
      assert.equal(c.logprobs.text_offset[i], [...c.logprobs.tokens.slice(0, i).join("")].length, `token ${i}'s text_offset`);
    });
    // Several prompts: prompt p's choice i at index p*n + i, each as the
    // prompt alone answers with the same seed.
    const prompts = ["package main\n", "func main() {"];
    const many = await client.completions.create({ model, prompt: prompts, n: 2, max_tokens: 6, temperature: 1, seed: 5 });
    assert.deepEqual(many.choices.map((c) => c.index), [0, 1, 2, 3]);
    for (const [p, prompt] of prompts.entries()) {
      const alone = await client.completions.create({ model, prompt, n: 2, max_tokens: 6, temperature: 1, seed: 5 });
      assert.deepEqual(many.choices.slice(2 * p, 2 * p + 2).map((c) => c.text), alone.choices.map((c) => c.text), prompt);
    }
    // echo with max_tokens 0 scores the prompts (an evaluation harness's
    // log-likelihood request): the text is the prompt, one entry a token,
    // the first without a log-probability.
    const scored = await client.completions.create({ model, prompt: prompts, echo: true, max_tokens: 0, logprobs: 1, temperature: 0 });
    assert.equal(scored.usage.completion_tokens, 0);
    for (const [p, prompt] of prompts.entries()) {
      const lp = scored.choices[p].logprobs;
      assert.equal(scored.choices[p].text, prompt);
      assert.equal(lp.tokens.join(""), prompt);
      assert.equal(lp.token_logprobs[0], null);
      assert.ok(lp.token_logprobs.slice(1).every((x) => x <= 0), "log-probabilities");
    }
  },

  async choices(model) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 1, seed: 3, n: 3 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    const again = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 1, seed: 3, n: 3 });
    assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content), "a seed repeats");
  },

  async abort(model) {
    const stream = await client.chat.completions.create({
      model, messages, max_tokens: 2000, temperature: 0, stream: true, ignore_eos: true,
    });
    let n = 0;
    for await (const chunk of stream) {
      if (++n === 3) break; // leaving the loop aborts the request
    }
    const deadline = Date.now() + 10_000;
    while ((await metric("vllm:num_requests_running")) !== 0) {
      assert.ok(Date.now() < deadline, "the aborted stream still runs after 10 s");
      await new Promise((r) => setTimeout(r, 20));
    }
  },

  async tools(model) {
    // A tool round trip as an application sends it: the tools, the
    // assistant's call and the tool's result. The tiny model writes Go,
    // not calls, so the answer is text.
    const tools = [{ type: "function", function: { name: "get_weather", description: "Weather of a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
    const history = [
      ...messages,
      { role: "assistant", content: null, tool_calls: [
        { id: "functions.get_weather:0", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
      { role: "tool", tool_call_id: "functions.get_weather:0", content: "18 C" },
    ];
    const r = await client.chat.completions.create({ model, messages: history, tools, tool_choice: "auto", max_tokens: 8, temperature: 0 });
    assert.equal(typeof r.choices[0].message.content, "string");
    assert.ok(["stop", "length", "tool_calls"].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
    // tool_choice required holds the answer to calls (arguments JSON);
    // within 300 tokens the tiny model may not close the section.
    const f = await client.chat.completions.create({ model, messages, tools, tool_choice: "required", max_tokens: 300, temperature: 1, seed: 2 });
    const fc = f.choices[0];
    assert.ok(["tool_calls", "length"].includes(fc.finish_reason), fc.finish_reason);
    if (fc.finish_reason === "tool_calls") {
      assert.ok(fc.message.tool_calls.length > 0);
      for (const call of fc.message.tool_calls) {
        assert.equal(call.type, "function");
        assert.equal(call.function.name, "get_weather");
        JSON.parse(call.function.arguments);
      }
    }
    // max_tokens cutting the forced section short: finish_reason length,
    // and the section's markup never in the content, whole or streamed
    // (a call whose arguments had begun comes back with them so far).
    const cut = { model, messages, tools, tool_choice: "required", max_tokens: 90, temperature: 0 };
    const c = (await client.chat.completions.create(cut)).choices[0];
    assert.equal(c.finish_reason, "length");
    assert.ok(!(c.message.content ?? "").includes("<|"), `markup in the content: ${c.message.content}`);
    for (const call of c.message.tool_calls ?? []) assert.equal(call.function.name, "get_weather");
    let streamed = "", finish = null;
    const calls = [];
    for await (const chunk of await client.chat.completions.create({ ...cut, stream: true })) {
      const ch = chunk.choices[0];
      if (!ch) continue;
      streamed += ch.delta?.content ?? "";
      for (const d of ch.delta?.tool_calls ?? []) calls[d.index] = d;
      finish = ch.finish_reason ?? finish;
    }
    assert.equal(finish, "length");
    assert.equal(streamed, c.message.content ?? "");
    assert.deepEqual(calls.map((d) => [d.id, d.function.arguments]), (c.message.tool_calls ?? []).map((d) => [d.id, d.function.arguments]));
    await assert.rejects(
      client.chat.completions.create({ model, messages, tools, tool_choice: { type: "function", function: { name: "nope" } } }),
      (err) => err instanceof OpenAI.BadRequestError && /tool_choice/.test(err.message),
    );
  },

  async structured(model) {
    // response_format json_schema (strict, as the client's helpers send
    // it): an answer that stops is a value of the schema.
    const schema = {
      type: "object", additionalProperties: false, required: ["city", "days"],
      properties: {
        city: { type: "string", maxLength: 12 }, days: { type: "integer" }, unit: { enum: ["C", "F"] },
        from: { type: "string", format: "date" }, code: { type: "string", pattern: "^[A-Z]{3}$" },
        chance: { type: "number", minimum: 0, maximum: 1 },
      },
    };
    let stopped = 0;
    for (const seed of [0, 1, 2, 3]) {
      const r = await client.chat.completions.create({
        model, messages, max_tokens: 240, temperature: 1, seed,
        response_format: { type: "json_schema", json_schema: { name: "forecast", strict: true, schema } },
      });
      const c = r.choices[0];
      assert.ok(["stop", "length"].includes(c.finish_reason), c.finish_reason);
      if (c.finish_reason !== "stop") continue;
      stopped++;
      const v = JSON.parse(c.message.content);
      assert.deepEqual(Object.keys(v).filter((k) => !["city", "days", "unit", "from", "code", "chance"].includes(k)), [], c.message.content);
      assert.equal(typeof v.city, "string");
      assert.ok([...v.city].length <= 12, c.message.content);
      assert.ok(Number.isInteger(v.days), c.message.content);
      assert.ok(v.unit === undefined || ["C", "F"].includes(v.unit), c.message.content);
      // A calendar date: Date reads it back to the same day.
      assert.ok(v.from === undefined || /^\d{4}-\d{2}-\d{2}$/.test(v.from) && new Date(v.from + "T00:00:00Z").toISOString().startsWith(v.from), c.message.content);
      assert.ok(v.code === undefined || /^[A-Z]{3}$/.test(v.code), c.message.content);
      assert.ok(v.chance === undefined || typeof v.chance === "number" && v.chance >= 0 && v.chance <= 1, c.message.content);
    }
    assert.ok(stopped > 0, "no structured answer finished within 240 tokens");
    await assert.rejects(
      client.chat.completions.create({ model, messages, response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", format: "uri" } } } }),
      (err) => err instanceof OpenAI.BadRequestError && /format/.test(err.message),
    );
  },

  async responses(model, whole) {
    // The Responses API: instructions and a user input item are the
    // chat's system and user messages, so the greedy answer is the chat's,
    // whole (the client's output_text) and through the client's stream
    // helper, which builds the response from the events.
    const req = { model, instructions: "You complete Go code.", input: [{ role: "user", content: "func main() {" }], max_output_tokens: 24, temperature: 0 };
    const r = await client.responses.create(req);
    assert.equal(r.object, "response");
    assert.ok(["completed", "incomplete"].includes(r.status), r.status);
    assert.equal(r.output_text, whole, "the Responses answer is the chat's");
    assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    let deltas = "", last = null;
    const stream = client.responses.stream(req);
    stream.on("response.output_text.delta", (e) => { deltas += e.delta; });
    // The helper's snapshot takes response.completed only; an answer the
    // limit cut ends with response.incomplete.
    stream.on("response.completed", (e) => { last = e.response; });
    stream.on("response.incomplete", (e) => { last = e.response; });
    const final = await stream.finalResponse();
    assert.equal(deltas, whole, "the streamed deltas");
    const finalText = final.output.filter((i) => i.type === "message").flatMap((i) => i.content).map((c) => c.text).join("");
    assert.equal(finalText, whole, "the stream's final response");
    assert.ok(last, "a response.completed or response.incomplete event");
    assert.equal(last.status, r.status);
    assert.equal(last.usage.output_tokens, r.usage.output_tokens);
    assert.equal(last.usage.input_tokens, r.usage.input_tokens);
    // A function-call round trip in the Responses shapes, then a forced
    // call (within 300 tokens the tiny model may not finish it).
    const tools = [{ type: "function", name: "get_weather", description: "Weather of a city", strict: false,
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
    const input = [...req.input,
      { type: "function_call", call_id: "functions.get_weather:0", name: "get_weather", arguments: '{"city":"Paris"}' },
      { type: "function_call_output", call_id: "functions.get_weather:0", output: "18 C" }];
    const t = await client.responses.create({ model, input, tools, max_output_tokens: 8, temperature: 0 });
    assert.ok(t.output.length > 0);
    const f = await client.responses.create({ model, input: req.input, tools, tool_choice: "required", max_output_tokens: 300, temperature: 1 });
    for (const item of f.output) {
      if (item.type !== "function_call") continue;
      assert.equal(item.name, "get_weather");
      if (item.status === "incomplete") {
        // The limit cut its arguments short: they may not parse.
        assert.equal(f.status, "incomplete");
        continue;
      }
      JSON.parse(item.arguments);
    }
    // Log-probabilities of the message's tokens.
    const lp = await client.responses.create({ ...req, include: ["message.output_text.logprobs"], top_logprobs: 2 });
    const part = lp.output.find((i) => i.type === "message").content[0];
    assert.equal(part.logprobs.length, lp.usage.output_tokens);
    assert.ok(spells(part.logprobs.map((e) => e.token), part.text), "the tokens spell the text");
    assert.ok(bytesSpell(part.logprobs, part.text), "the tokens' bytes spell the text");
    assert.ok(part.logprobs.every((e) => e.top_logprobs.length === 2 && e.logprob <= 0));
    // Kept responses: retrieved as answered, continued by
    // previous_response_id as the chat of both turns (the instructions
    // not carried over), deleted.
    assert.equal(r.store, true);
    const got = await client.responses.retrieve(r.id);
    assert.equal(got.output_text, whole);
    assert.equal(got.id, r.id);
    const next = await client.responses.create({ model, previous_response_id: r.id, input: "// again", max_output_tokens: 12, temperature: 0 });
    assert.equal(next.previous_response_id, r.id);
    const chat = await client.chat.completions.create({ model, max_tokens: 12, temperature: 0, messages: [
      { role: "user", content: "func main() {" }, { role: "assistant", content: whole }, { role: "user", content: "// again" }] });
    assert.equal(next.output_text, chat.choices[0].message.content, "the continued response is the chat of both turns");
    await client.responses.delete(r.id);
    await assert.rejects(client.responses.retrieve(r.id), (err) => err instanceof OpenAI.NotFoundError);
    await assert.rejects(
      client.responses.create({ ...req, previous_response_id: r.id }),
      (err) => err instanceof OpenAI.BadRequestError && /previous_response_id/.test(err.message),
    );
    const unkept = await client.responses.create({ ...req, max_output_tokens: 2, store: false });
    assert.equal(unkept.store, false);
    await assert.rejects(client.responses.retrieve(unkept.id), (err) => err instanceof OpenAI.NotFoundError);
  },

  async invalid(model) {
    await assert.rejects(
      client.chat.completions.create({ model, messages, temperature: 5 }),
      (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && /temperature/.test(err.message),
    );
    await assert.rejects(
      client.chat.completions.create({ model: "no-such-model", messages }),
      (err) => err instanceof OpenAI.NotFoundError && err.status === 404,
    );
    const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: "wrong", maxRetries: 0 });
    await assert.rejects(bad.models.list(), (err) => err instanceof OpenAI.AuthenticationError);
  },
};

const model = await checks.models();
const whole = await checks.chat(model);
for (const [name, check] of Object.entries(checks)) {
  if (name === "models" || name === "chat") continue;
  await check(model, whole);
  console.log(`ok  ${name}`);
}
console.log(`openai ${VERSION} client: all checks passed against ${base} (model ${model})`);
