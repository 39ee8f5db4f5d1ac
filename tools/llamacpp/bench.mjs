// Times llama.cpp's prefill of the peer model that `go run ./tools/llamacpp`
// writes: one batch of the whole prompt (no token generated), the best of
// several runs, on the CPU only with a given thread count. It prints the
// tokens a second of every run and, from MODEL.json, the best run's
// GFLOP/s of products (two a parameter and token): divide by the peak
// `k3 bench kernels` probes in the same sitting for the share that issue
// 20 compares with k3's.
//
//	node bench.mjs MODEL.gguf [tokens=512] [threads=all] [runs=5]
//
// node-llama-cpp warns on load that the model's tokenizer does not give
// text back as it was: the peer model's vocabulary is synthetic, and only
// token ids are fed to it.
import { readFileSync } from "node:fs";
import os from "node:os";
import { getLlama } from "node-llama-cpp";

const [path, tokensArg, threadsArg, runsArg] = process.argv.slice(2);
if (!path) {
  console.error("usage: node bench.mjs MODEL.gguf [tokens=512] [threads=all] [runs=5]");
  process.exit(2);
}
const n = Number(tokensArg ?? 512);
const threads = Number(threadsArg ?? os.availableParallelism());
const runs = Number(runsArg ?? 5);
for (const [name, v] of [["tokens", n], ["threads", threads], ["runs", runs]]) {
  if (!Number.isInteger(v) || v < 1) {
    console.error(`bench.mjs: ${name} ${v}: want a positive integer`);
    process.exit(2);
  }
}
let productParams;
try {
  ({ productParams } = JSON.parse(readFileSync(path + ".json", "utf8")));
} catch (err) {
  console.error(`bench.mjs: ${path}.json: ${err.message} (go run ./tools/llamacpp -o ${path} writes it beside the model)`);
  process.exit(2);
}
if (!(productParams > 0)) {
  console.error(`bench.mjs: ${path}.json: productParams ${productParams}: want a positive count`);
  process.exit(2);
}

const llama = await getLlama({ gpu: false, build: "never" });
const model = await llama.loadModel({ modelPath: path });
// A context no longer than the prompt ran llama.cpp at about half its
// speed (node-llama-cpp 3.21.1, a 512-token prompt: 440 against 820
// tokens/s), so the context has room to spare, as an application's would.
const context = await model.createContext({ contextSize: Math.max(2 * n, 4096), batchSize: n, threads });
const seq = context.getSequence();
// Words of the peer model's vocabulary (tools/llamacpp: from token 259).
const tokens = Array.from({ length: n }, (_, i) => 259 + ((i * 7) % (model.tokens.count - 259)));
const rates = [];
for (let r = 0; r < runs; r++) {
  await seq.clearHistory();
  const start = process.hrtime.bigint();
  await seq.evaluateWithoutGeneratingNewTokens(tokens);
  rates.push(n / (Number(process.hrtime.bigint() - start) / 1e9));
}
const best = Math.max(...rates);
console.log(`CPU: ${os.cpus()[0]?.model ?? "unknown"}; llama.cpp via node-llama-cpp, ${threads} threads`);
console.log(`prefill of ${n} tokens: ${rates.map((t) => t.toFixed(1)).join(", ")} tokens/s`);
console.log(`best ${best.toFixed(1)} tokens/s, ${((best * 2 * productParams) / 1e9).toFixed(1)} GFLOP/s of products (${(productParams / 1e6).toFixed(1)}M parameters)`);
await context.dispose();
await model.dispose();
await llama.dispose();
