/**
 * The built-in text the synthetic tokenizer is trained on. Original prose written for this
 * project: English about inference engines, a little code, numbers, the chat-format tag words
 * (so `message`, `role`, `assistant` become single tokens) and a few lines in other scripts so
 * multi-byte UTF-8 shows up in the merges. Changing this text changes every synthetic vocabulary.
 */

const PROSE = `
The engine reads a checkpoint from disk and runs the model one token at a time. Each step
starts with the embedding of the last token, passes it through every layer, and ends with a
vector of scores over the vocabulary. The sampler picks the next token from those scores, and
the loop repeats until the model writes the end of the message or the caller asks it to stop.

A layer has two halves. The first half mixes information across positions: either a linear
attention layer that keeps a small recurrent state, or a full attention layer that keeps a
cache of compressed keys and values. The second half is a feed forward network. In most layers
that network is a mixture of experts: a router scores every expert, the best few are chosen,
and only those experts do any work for this token. The rest of the experts stay on disk.

Because the experts are large and the memory is small, the engine streams them. While one
layer computes, the reads for the next layer are already in flight. A cache keeps the experts
that were used recently, since the same experts tend to be chosen again for nearby tokens. When
the cache is full, the expert that was used least recently is the first to be replaced.

Numbers matter. The weights are stored in compact formats: most matrices use sixteen bit
floats, and the experts use four bit codes with one shared scale for every group of thirty two
values. The engine widens each weight exactly when it needs it and keeps every activation in
thirty two bit floats. The order of every sum is fixed, so the same prompt gives the same
tokens on any machine, with any number of threads, and with any memory budget.

Tests compare the engine with an independent reference written in plain arithmetic. A small
model with random weights is enough to find most mistakes: a swapped dimension, a missing
norm, a sign error in a gate, or an index that counts from one instead of zero. The small
model keeps every width different from every other width, so a mistake cannot hide behind a
coincidence. When a test fails, it names the layer, the tensor and the position.

The tokenizer turns text into numbers. It first splits the text into words, spaces, digits and
punctuation, then merges bytes into larger pieces in the order it learned them. Every single
byte is a token of its own, so any text can be encoded, even text the tokenizer has never seen.
Special tokens mark the structure of a conversation: where a message opens, where it closes,
and where it ends. They are never produced by ordinary text, only by the chat renderer.

A conversation is a list of messages. Each message has a role: the system sets the rules, the
user asks, the assistant answers, and a tool reports the result of a call. The assistant may
think before it answers; the thinking goes into its own channel, and the response follows in
another channel. When the assistant wants to call a tool, it writes the name of the tool and
its arguments, each with a key, a type and a value.

Users ask many kinds of questions. What is the weather in the city today? How many days are
left until the end of the month? Can you explain why the sky is blue? Please write a short
poem about the sea. Translate this sentence into French. Summarize the following article in
three sentences. Which of these two numbers is larger? Find the bug in this function.

The answers should be clear and short. A good answer states the result first and then gives
the reasons. If the question is unclear, the assistant asks what the user means. If a tool is
needed, the assistant calls it and waits for the result before it answers. It does not invent
results, and it says so when it does not know.

Memory is planned before anything is loaded. The plan adds up the trunk, the expert cache, the
attention caches and the recurrent states, compares the sum with the budget, and refuses to
start when it does not fit. Nothing is allocated before the plan says it fits. A read that
fails, or returns fewer bytes than asked, never becomes a token: the run stops and says why.

Files the user owns are replaced atomically. The new content is written to a temporary file
in the same directory, flushed to the disk, and then renamed over the old file. A crash at any
moment leaves either the old file or the complete new one, never a file that is half written.
`;

const DIALOGUE = `
message role="system" You are a helpful assistant.
message role="user" Hello! Could you help me plan a trip?
message role="assistant" think The user wants a trip plan. I should ask where and when.
response Of course. Where would you like to go, and for how many days?
message role="user" Three days in Hangzhou, next week.
message role="assistant" response Here is a plan for three days in Hangzhou.
tools call tool="get_weather" index="1" argument key="city" type="string" Hangzhou
argument key="days" type="number" 3
message role="tool" tool="get_weather" index="1" {"temp": 21, "sky": "clear"}
message role="assistant" response The weather will be clear, around 21 degrees.
thinking_effort low medium high max response_format json_object json_schema tool_choice
`;

const CODE = `
function rmsNorm(x: Float32Array, weight: Float32Array, eps: number): Float32Array {
  let sum = 0;
  for (let i = 0; i < x.length; i++) sum += x[i] * x[i];
  const scale = 1 / Math.sqrt(sum / x.length + eps);
  const out = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] * scale * weight[i];
  return out;
}

export async function readConfig(path: string): Promise<Config> {
  const text = await Deno.readTextFile(path);
  const json = JSON.parse(text);
  if (typeof json.hidden_size !== "number") throw new Error("missing hidden_size");
  return { hiddenSize: json.hidden_size, numLayers: json.num_hidden_layers };
}

static void matvec(const float *w, const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double acc = 0.0;
        for (int c = 0; c < cols; c++) acc += (double)w[r * cols + c] * x[c];
        y[r] = (float)acc;
    }
}

def softmax(scores):
    m = max(scores)
    e = [math.exp(s - m) for s in scores]
    total = sum(e)
    return [v / total for v in e]
`;

const NUMBERS = `
0 1 2 3 4 5 6 7 8 9 10 11 12 16 24 32 48 64 96 128 256 512 1024 2048 4096 7168 12288
3.14159 2.71828 1.41421 0.5 0.25 0.125 1e-5 1e-6 -5.0 4.0 25.0 100% 42 2026-01-15 12:30:45
$19.99 #7 @home 1,234,567 (a + b) * c = d; x[i] <= y[j] && z != w || !v
`;

const OTHER_SCRIPTS = `
你好，世界！今天天气很好。我们一起去杭州吧。模型、专家、注意力、词表。
こんにちは、東京タワーへようこそ。ありがとうございます。
안녕하세요, 만나서 반갑습니다.
Здравствуйте! Как дела? Привет, мир.
Γειά σου κόσμε. Ελληνικά γράμματα: α β γ δ.
Café, naïve, façade, résumé, jalapeño, Zürich, São Paulo, Kraków.
🙂 🚀 ✨ 👍🏽 👨‍👩‍👧 — “quotes” ‘single’ … → ← ≤ ≥ ≠ ∑ √ ∞ °C €
`;

const CONTRACTIONS = `
It's what we've said: they're here, you'll see, I'm sure, she'd know, don't worry, can't stop,
won't wait, isn't it? We'll go. You've been there. They'd agree. I'd rather not. He's right.
`;

/** The training corpus: every part above, in a fixed order. */
export const SYNTH_CORPUS: string = [PROSE, DIALOGUE, CODE, NUMBERS, OTHER_SCRIPTS, CONTRACTIONS]
  .join("\n");
