// The official OpenAI Node client (the `openai` package, pinned in package.json) against
// `sieve serve`: what a real client parses out of our responses, not what our own tests expect.
// Starts `sieve serve` on a free loopback port, runs every check, stops the server with SIGTERM
// and expects a clean exit. Prints one line per check; exits 1 when any check fails.
//
// Usage: node test.mjs SIEVE_BINARY MODEL_DIR
import { spawn } from 'node:child_process';
import OpenAI from 'openai';

const [sieveBinary, modelDir] = process.argv.slice(2);
if (!sieveBinary || !modelDir) {
  console.error('usage: node test.mjs SIEVE_BINARY MODEL_DIR');
  process.exit(2);
}

const kApiKey = 'sieve-test-key';
const kModel = 'sieve-tiny-10m';
const kMaxTokens = 8;
// Long enough that a generation is still running when the client aborts it (a CPU decodes the
// 10M model at 50-500 tokens/s: seconds of work), short enough for the 4,096-token context.
const kAbortMaxTokens = 3000;

let server = null;  // the `sieve serve` child process
let serverLog = '';  // its stdout and stderr, for failure messages
// The whole run, server start-up included; CTest's TIMEOUT is the backstop.
const deadline = setTimeout(() => {
  console.error('FAIL the test did not finish within 120 s');
  server?.kill('SIGKILL');
  process.exit(1);
}, 120_000);

class CheckError extends Error {}
function expect(condition, message) {
  if (!condition) throw new CheckError(message);
}
function expectEqual(actual, wanted, what) {
  expect(
    JSON.stringify(actual) === JSON.stringify(wanted),
    `${what}: got ${JSON.stringify(actual)}, want ${JSON.stringify(wanted)}`,
  );
}
function expectUsage(usage, completionTokens, what) {
  expect(usage != null, `${what}: no usage`);
  expectEqual(usage.completion_tokens, completionTokens, `${what}: usage.completion_tokens`);
  expect(usage.prompt_tokens > 0, `${what}: usage.prompt_tokens is ${usage.prompt_tokens}`);
  expectEqual(
    usage.total_tokens,
    usage.prompt_tokens + usage.completion_tokens,
    `${what}: usage.total_tokens`,
  );
}
// Runs `body`, which must throw an APIError of class `errorClass` with this status.
async function expectApiError(errorClass, status, body) {
  try {
    await body();
  } catch (error) {
    expect(
      error instanceof errorClass,
      `want ${errorClass.name}, got ${error?.constructor?.name}: ${error?.message}`,
    );
    expectEqual(error.status, status, 'status');
    return error;
  }
  throw new CheckError(`want ${errorClass.name} (${status}), but the request succeeded`);
}

let failures = 0;
async function check(name, body) {
  try {
    const note = await body();
    console.log(`ok   ${name}${note ? `: ${note}` : ''}`);
  } catch (error) {
    failures += 1;
    const detail = error instanceof CheckError ? error.message : error?.stack ?? String(error);
    console.log(`FAIL ${name}: ${detail}`);
  }
}

// Starts `sieve serve` on a free port and resolves with its base URL once it logs where it
// listens.
function startServer() {
  server = spawn(
    sieveBinary,
    [
      'serve', '--model', modelDir, '--device', 'cpu', '--threads', '2', '--port', '0',
      '--kv-memory', '64M', '--api-key', kApiKey, '--shutdown-timeout', '2',
      // sieve-tiny-10m is a retrieval model whose tokenizer has no chat template: the chat
      // endpoint needs one to render messages (the text is noise either way; the protocol is
      // what is checked).
      '--chat-template', 'llama3',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  return new Promise((resolve, reject) => {
    const onData = (data) => {
      serverLog += data.toString();
      const match = serverLog.match(/on (http:\/\/[^ ]+:[0-9]+)/);
      if (match) resolve(match[1]);
    };
    server.stdout.on('data', onData);
    server.stderr.on('data', onData);
    server.on('error', reject);
    server.on('exit', (code, signal) =>
      reject(new Error(`sieve serve exited (code ${code}, signal ${signal}):\n${serverLog}`)));
  });
}

// Sends SIGTERM and resolves with the exit code (null when it had to be killed).
function stopServer() {
  if (server.exitCode !== null || server.signalCode !== null) {
    return Promise.resolve(server.exitCode);
  }
  return new Promise((resolve) => {
    const kill = setTimeout(() => {
      server.kill('SIGKILL');
      resolve(null);
    }, 15_000);
    server.once('exit', (code) => {
      clearTimeout(kill);
      resolve(code);
    });
    server.kill('SIGTERM');
  });
}

// The value of the first sample of `name` on /metrics (which needs no API key); the server
// labels every sample with model_name.
async function metric(baseUrl, name) {
  const text = await (await fetch(`${baseUrl}/metrics`)).text();
  const line = text
    .split('\n')
    .find((entry) => entry.startsWith(`${name}{`) || entry.startsWith(`${name} `));
  expect(line !== undefined, `/metrics has no sample ${name}`);
  return Number(line.split(' ').pop());
}

const serverUrl = await startServer().catch((error) => {
  console.log(`FAIL sieve serve did not start: ${error.message}`);
  process.exit(1);
});
console.log(`sieve serve listening on ${serverUrl}`);
// No retries: a retried request would hide a server that dropped a connection or answered 5xx.
const client = new OpenAI({ baseURL: `${serverUrl}/v1`, apiKey: kApiKey, maxRetries: 0 });
const completionParams = {
  model: kModel,
  prompt: 'The passkey is 4721. Remember it. The passkey is',
  max_tokens: kMaxTokens,
  temperature: 0,
  // Sieve's (and vLLM's) extension: exactly max_tokens tokens, so usage can be checked exactly.
  ignore_eos: true,
};
const chatParams = {
  model: kModel,
  messages: [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'What is the passkey?' },
  ],
  max_tokens: kMaxTokens,
  temperature: 0,
  ignore_eos: true,
};

await check('models.list names the served model', async () => {
  const ids = [];
  for await (const model of client.models.list()) ids.push(model.id);
  expect(ids.includes(kModel), `model ids ${JSON.stringify(ids)} lack ${kModel}`);
});

let completionText = null;
await check('completions.create', async () => {
  const completion = await client.completions.create(completionParams);
  expectEqual(completion.object, 'text_completion', 'object');
  expectEqual(completion.model, kModel, 'model');
  expectEqual(completion.choices.length, 1, 'number of choices');
  const [choice] = completion.choices;
  expectEqual(choice.index, 0, 'choice index');
  expectEqual(choice.finish_reason, 'length', 'finish_reason');
  expect(typeof choice.text === 'string' && choice.text.length > 0, 'empty text');
  expectUsage(completion.usage, kMaxTokens, 'completion');
  completionText = choice.text;
  return JSON.stringify(choice.text);
});

await check('completions.create streamed: same text as unstreamed', async () => {
  const stream = await client.completions.create({ ...completionParams, stream: true });
  let text = '';
  let finishReason = null;
  for await (const chunk of stream) {
    expectEqual(chunk.object, 'text_completion', 'chunk object');
    text += chunk.choices[0].text;
    finishReason = chunk.choices[0].finish_reason ?? finishReason;
  }
  expectEqual(finishReason, 'length', 'finish_reason');
  // Greedy decoding: the stream must spell what the unstreamed request returned.
  expectEqual(text, completionText, 'streamed text');
});

let chatText = null;
await check('chat.completions.create', async () => {
  const completion = await client.chat.completions.create(chatParams);
  expectEqual(completion.object, 'chat.completion', 'object');
  const [choice] = completion.choices;
  expectEqual(choice.message.role, 'assistant', 'role');
  expectEqual(choice.finish_reason, 'length', 'finish_reason');
  expectUsage(completion.usage, kMaxTokens, 'chat completion');
  chatText = choice.message.content;
  return JSON.stringify(chatText);
});

await check('chat.completions.create streamed with include_usage', async () => {
  const stream = await client.chat.completions.create({
    ...chatParams,
    stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  expect(chunks.length >= 3, `only ${chunks.length} chunks`);
  const last = chunks.at(-1);
  // OpenAI: every chunk carries "usage": null except a last one with no choices and the usage.
  for (const chunk of chunks.slice(0, -1)) {
    expectEqual(chunk.object, 'chat.completion.chunk', 'chunk object');
    const usage = JSON.stringify(chunk.usage);
    expect(chunk.usage === null, `a chunk before the last has usage ${usage}`);
  }
  expectEqual(last.choices, [], 'choices of the usage chunk');
  expectUsage(last.usage, kMaxTokens, 'usage chunk');
  expectEqual(chunks[0].choices[0].delta.role, 'assistant', 'role of the first delta');
  const content = chunks.map((chunk) => chunk.choices[0]?.delta?.content ?? '').join('');
  expectEqual(content, chatText, 'streamed content (greedy: as unstreamed)');
  const finish = chunks.map((chunk) => chunk.choices[0]?.finish_reason).filter(Boolean);
  expectEqual(finish, ['length'], 'finish_reasons');
  return `${chunks.length} chunks, usage ${JSON.stringify(last.usage)}`;
});

await check('completions.create with n = 3', async () => {
  const completion = await client.completions.create({
    ...completionParams,
    n: 3,
    temperature: 1,
    seed: 7,
  });
  expectEqual(completion.choices.map((choice) => choice.index).sort(), [0, 1, 2], 'indices');
  for (const choice of completion.choices) {
    expectEqual(choice.finish_reason, 'length', `finish_reason of choice ${choice.index}`);
  }
  expectUsage(completion.usage, 3 * kMaxTokens, 'n = 3');
});

await check('chat.completions.create streamed with n = 2', async () => {
  const stream = await client.chat.completions.create({
    ...chatParams,
    n: 2,
    temperature: 1,
    stream: true,
    stream_options: { include_usage: true },
  });
  const finish = new Map();
  let usage = null;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      if (choice.finish_reason) finish.set(choice.index, choice.finish_reason);
    }
    usage = chunk.usage ?? usage;
  }
  expectEqual([...finish.entries()].sort(), [[0, 'length'], [1, 'length']], 'finish per choice');
  expectUsage(usage, 2 * kMaxTokens, 'n = 2 stream');
});

await check('completions.create with logprobs = 2', async () => {
  const completion = await client.completions.create({ ...completionParams, logprobs: 2 });
  const { logprobs } = completion.choices[0];
  expect(logprobs != null, 'no logprobs');
  expectEqual(logprobs.tokens.length, kMaxTokens, 'number of tokens');
  expectEqual(logprobs.tokens.join(''), completion.choices[0].text, 'tokens joined');
  expectEqual(logprobs.text_offset[0], 0, 'first text_offset');
  logprobs.token_logprobs.forEach((logprob, index) => {
    const top = logprobs.top_logprobs[index];
    const topValues = Object.values(top);
    // The top 2, plus the chosen token when it is not among them (as vLLM).
    expect(
      topValues.length >= 1 && topValues.length <= 3,
      `top_logprobs[${index}] has ${topValues.length} entries`,
    );
    expect(Number.isFinite(logprob) && logprob <= 0, `token_logprobs[${index}] is ${logprob}`);
    // Greedy decoding picks the most likely token.
    expect(
      logprob >= Math.max(...topValues) - 1e-4,
      `token ${index} (${logprob}) is not the most likely of ${JSON.stringify(top)}`,
    );
  });
});

await check('chat.completions.create with logprobs, top_logprobs = 2', async () => {
  const completion = await client.chat.completions.create({
    ...chatParams,
    logprobs: true,
    top_logprobs: 2,
  });
  const content = completion.choices[0].logprobs?.content;
  expect(Array.isArray(content), `no logprobs.content: ${JSON.stringify(completion.choices[0])}`);
  expectEqual(content.length, kMaxTokens, 'number of tokens');
  content.forEach((entry, index) => {
    expect(
      Number.isFinite(entry.logprob) && entry.logprob <= 0,
      `logprob ${index} is ${entry.logprob}`,
    );
    expectEqual(entry.top_logprobs.length, 2, `top_logprobs of token ${index}`);
    expectEqual(entry.top_logprobs[0].token, entry.token, `greedy token ${index} is the top one`);
  });
  // The tokens' bytes spell the message.
  const bytes = Buffer.from(content.flatMap((entry) => entry.bytes));
  expectEqual(bytes.toString('utf8'), completion.choices[0].message.content, 'bytes of the tokens');
});

await check('a bad parameter is a BadRequestError naming it', async () => {
  const error = await expectApiError(OpenAI.BadRequestError, 400, () =>
    client.completions.create({ ...completionParams, max_tokens: 100_000 }));
  expectEqual(error.param, 'max_tokens', 'param');
  expectEqual(error.type, 'invalid_request_error', 'type');
  expect(/maximum context length/.test(error.message), `message: ${error.message}`);
  return error.message;
});

await check('a bad parameter on a stream is an error before any chunk', async () => {
  const error = await expectApiError(OpenAI.BadRequestError, 400, () =>
    client.chat.completions.create({ ...chatParams, n: 0, stream: true }));
  expectEqual(error.param, 'n', 'param');
});

await check('an unknown model is a NotFoundError', async () => {
  const error = await expectApiError(OpenAI.NotFoundError, 404, () =>
    client.completions.create({ ...completionParams, model: 'gpt-4o' }));
  expectEqual(error.code, 'model_not_found', 'code');
  expect(error.message.includes('gpt-4o'), `message: ${error.message}`);
});

await check('a wrong API key is an AuthenticationError', async () => {
  const stranger = new OpenAI({ baseURL: `${serverUrl}/v1`, apiKey: 'wrong', maxRetries: 0 });
  const error = await expectApiError(OpenAI.AuthenticationError, 401, () =>
    stranger.completions.create(completionParams));
  expect(/API key/.test(error.message), `message: ${error.message}`);
});

await check('an abort mid-stream ends the generation; the server keeps serving', async () => {
  const abortedBefore = await metric(serverUrl, 'sieve:num_requests_aborted_total');
  const controller = new AbortController();
  const stream = await client.completions.create(
    { ...completionParams, max_tokens: kAbortMaxTokens, stream: true },
    { signal: controller.signal },
  );
  let chunks = 0;
  let finishReason = null;
  // The client ends the iteration quietly when its own signal aborts the request (after the
  // events it had already received in the same read, if any).
  for await (const chunk of stream) {
    chunks += 1;
    finishReason = chunk.choices[0]?.finish_reason ?? finishReason;
    if (chunks === 3) controller.abort();
  }
  expect(chunks >= 3, `the stream ended after ${chunks} chunks, before the abort`);
  expectEqual(finishReason, null, 'finish_reason (the generation must not have finished)');
  // The server sees the connection close and aborts the engine request, freeing its KV pages.
  let running = -1;
  let aborted = abortedBefore;
  for (let attempt = 0; attempt < 100; attempt += 1) {
    running = await metric(serverUrl, 'sieve:num_requests_running');
    aborted = await metric(serverUrl, 'sieve:num_requests_aborted_total');
    if (running === 0 && aborted > abortedBefore) break;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  expectEqual(running, 0, 'requests running 5 s after the abort');
  expectEqual(aborted, abortedBefore + 1, 'sieve:num_requests_aborted_total');
  const next = await client.completions.create(completionParams);
  expectEqual(next.choices[0].text, completionText, 'the next request\'s text');
});

const exitCode = await stopServer();
await check('sieve serve exits cleanly on SIGTERM', async () => {
  expectEqual(exitCode, 0, `exit code (log:\n${serverLog})`);
});
clearTimeout(deadline);
if (failures > 0) {
  console.log(`${failures} check(s) failed; sieve serve's log:\n${serverLog}`);
  process.exit(1);
}
console.log('all OpenAI client checks passed');
