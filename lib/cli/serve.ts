/**
 * `k3 serve MODEL_DIR [--host H] [--port P] [--api-key KEY] ...`: the HTTP server (OpenAI Chat
 * Completions, Completions and Responses; Anthropic Messages; Ollama), in this process, on one
 * shared engine.
 */
import { loadingBar } from "../io/progress.ts";
import * as path from "node:path";
import { badInput, ExitCode } from "../errors.ts";
import { type Engine, openEngine } from "../engine/open.ts";
import { stateBytes } from "../memory/plan.ts";
import { formatBytes } from "../io/sizes.ts";
import { type K3Server, type ServerOptions, startServer } from "../serve/server.ts";
import {
  DEFAULT_MAX_BATCH,
  DEFAULT_PASS_TOKENS,
  DEFAULT_RETAIN,
  Session,
} from "../generate/session.ts";
import type { SpeculationConfig } from "../speculate/speculate.ts";
import { applyThreads, intFlag, modelDirArg, numberFlag, parseCommand } from "./flags.ts";
import {
  CONTEXT_DEFAULT_HELP,
  contextFlag,
  listPresetsIfAsked,
  MEMORY_HELP,
  MEMORY_OPTIONS,
  memoryFlags,
  PREFILL_CHUNK,
} from "./memory_flags.ts";
import { SPECULATE_HELP, SPECULATE_OPTIONS, speculationFlags } from "./speculate_flags.ts";
import { DEFAULT_DRAFT_MAX } from "../speculate/speculate.ts";

const DEFAULT_MAX_BODY = 8 * 1024 * 1024;

const DEFAULT_MODEL_NAME = "kimi-k3";

const HELP = `usage: k3 serve MODEL_DIR [options]

An HTTP server on one engine shared by every client. Up to --max-batch requests generate
at once, their forward passes run as one (each weight read once per pass for all of them);
a request that arrives joins at the next pass, later ones wait in arrival order.
OpenAI: POST /v1/chat/completions, /v1/completions, /v1/responses (Responses API);
Anthropic: POST /v1/messages; GET /v1/models, /health.
Ollama: POST /api/chat, /api/generate, /api/show; GET /api/tags, /api/ps, /api/version.
Prometheus: GET /metrics.

listening:
  --host HOST        address to bind (default 127.0.0.1; anything else exposes the model
                     to the network: set an API key)
  --port N           port (default 8080; 0 picks a free one, printed at start)
  --api-key KEY      require "Authorization: Bearer KEY" or "x-api-key: KEY" on /v1
                     (default: $K3_API_KEY)
  --model-name NAME  a name requests may use for the model (repeatable; default
                     "${DEFAULT_MODEL_NAME}" and the model folder's name)
  --cors ORIGIN      let web pages from ORIGIN call the API (repeatable; * for any):
                     CORS headers and OPTIONS preflight. Without it a request that
                     carries an Origin header is refused (403)
  --max-body BYTES   largest request body (default ${DEFAULT_MAX_BODY})
  --max-connections N  connections served at once; more get a 503 (default 128)
  --header-timeout S   seconds for a request head to arrive, idle keep-alive included
                       (default 10)
  --body-timeout S     seconds for a request body to arrive (default 60)
  --keepalive S        a streamed answer silent for S seconds (queued, or a long prompt
                       prefilling) gets a keep-alive: ": keep-alive" (OpenAI, Responses),
                       a ping event (Anthropic); proxies cut silent streams (default 15;
                       0: never)
  --drain-timeout S    on SIGTERM or SIGINT: stop accepting, let running requests finish
                       for up to S seconds, then cancel the rest (they answer "shutting
                       down") and exit 0 (default 30)
generation:
  --context N        prompt + completion tokens per request
                     (${CONTEXT_DEFAULT_HELP})
  --retain N         conversation states kept for reuse by follow-up turns; the memory
                     plan holds them (default: up to ${DEFAULT_RETAIN}, as many as an eighth of the
                     budget holds at --context positions each)
  --max-batch N      sequences generating at once (an n-choice request takes n); the
                     memory plan holds N sequence states, more requests wait (default:
                     up to ${DEFAULT_MAX_BATCH}, as many as a quarter of the budget holds)
  --pass-tokens N    a fixed budget per forward pass while other requests stream: every
                     running request's next step, then prompt tokens up to N (at most the
                     plan's batch). Without it, such a pass takes the prompt tokens whose
                     compute its measured cost without them pays for (${DEFAULT_PASS_TOKENS} until
                     the first pass is measured). Either way every stream gets a token each
                     pass, and a prompt no stream waits beside runs as one pass as wide as
                     the plan holds
machine:
  --threads N        OpenMP threads (default: OMP_NUM_THREADS or all cores)
${SPECULATE_HELP}
                        (a request's "speculate" field overrides it: "ngram", "off", or
                        {"draft_max": K, "policy": "cost"|"always"}; draft_max is capped
                        at --draft-max, default 4, which the memory plan holds)
${MEMORY_HELP}
`;

/** The flags `k3 serve` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  host: { type: "string", default: "127.0.0.1" },
  port: { type: "string" },
  "api-key": { type: "string" },
  "model-name": { type: "string", multiple: true },
  cors: { type: "string", multiple: true },
  context: { type: "string" },
  "max-body": { type: "string" },
  retain: { type: "string" },
  "max-batch": { type: "string" },
  "pass-tokens": { type: "string" },
  "max-connections": { type: "string" },
  "header-timeout": { type: "string" },
  "body-timeout": { type: "string" },
  keepalive: { type: "string" },
  "drain-timeout": { type: "string" },
  threads: { type: "string" },
  ...SPECULATE_OPTIONS,
  ...MEMORY_OPTIONS,
  help: { type: "boolean", short: "h" },
} as const;

type ServeValues = NonNullable<ReturnType<typeof parseServe>>["values"];

function parseServe(args: string[]) {
  return parseCommand(args, OPTIONS, HELP);
}

/** What `k3 serve`'s flags ask for, checked before anything is opened. */
interface ServeFlags {
  dir: string;
  context: number;
  /** --max-batch and --retain; absent, what the budget holds. */
  maxBatch?: number;
  retain?: number;
  /** --pass-tokens: a fixed budget; absent, by measured cost. */
  passTokens?: number;
  speculation?: SpeculationConfig;
  /** The most drafts a request may ask for: the plan holds a verify pass of that many. */
  draftLimit: number;
  listen: Omit<ServerOptions, "contextTokens">;
  /** Seconds running requests may take to finish once a stop signal came. */
  drainTimeout: number;
}

export async function serveCommand(args: string[]): Promise<number> {
  const parsed = parseServe(args);
  if (!parsed) return ExitCode.ok;
  const { values, positionals } = parsed;
  if (listPresetsIfAsked(values)) return ExitCode.ok;
  const flags = serveFlags(values, positionals);
  applyThreads(values.threads);

  const engine = await openEngine(flags.dir, {
    ...memoryFlags(values),
    context: flags.context,
    // A request may speculate even when the server does not: plan for the cap it may use.
    draftMax: flags.draftLimit,
    // The plan holds every sequence of the batch and every retained state. A pass shared with
    // other streams' steps takes at most --pass-tokens tokens (more only for every sequence's
    // step); a pass no step shares is as wide as the plan holds, so a lone prompt is one read
    // of the trunk (--pass-tokens, the chunk, bounds its scratch).
    prefillChunk: flags.passTokens ?? DEFAULT_PASS_TOKENS,
    sequences: flags.maxBatch ?? "auto",
    retained: flags.retain ?? "auto",
    // A cancelled request's state is discarded: no KDA copy to put back (restoreOnStop).
    stoppable: false,
    log: (line) => console.error(line),
    load: { onLoad: loadingBar() },
  });
  const { sequences, retained } = engine.batch;
  const session = new Session(engine.model, {
    retain: retained,
    prefillChunk: PREFILL_CHUNK,
    speculation: flags.speculation,
    draftLimit: flags.draftLimit,
    maxBatch: sequences,
    passTokens: flags.passTokens,
    passCap: engine.plan.batch,
    restoreOnStop: false,
  });
  const server = await listen(
    { session, tokenizer: engine.tokenizer, stopIds: engine.stopIds },
    { ...flags.listen, contextTokens: flags.context },
  );
  announce(flags, engine, session, server);
  await untilSignal();
  console.error(
    `k3 serve: shutting down: no new connections; running requests have ${flags.drainTimeout} ` +
      "s (--drain-timeout) to finish",
  );
  await server.shutdown(flags.drainTimeout * 1000);
  engine.close();
  return ExitCode.ok;
}

/** Every flag checked, before anything is opened. */
function serveFlags(values: ServeValues, positionals: string[]): ServeFlags {
  const dir = modelDirArg(positionals, "serve");
  const port = intFlag("port", values.port, 8080, 0, 65535);
  const maxBody = intFlag("max-body", values["max-body"], DEFAULT_MAX_BODY, 1);
  const retain = optionalInt("retain", values.retain, 0, 1024);
  const maxBatch = optionalInt("max-batch", values["max-batch"], 1, 1024);
  const passTokens = optionalInt("pass-tokens", values["pass-tokens"], 1, 1 << 20);
  const maxConnections = intFlag("max-connections", values["max-connections"], 128, 1, 65536);
  const headerTimeout = numberFlag("header-timeout", values["header-timeout"], 0.001, 86400) ?? 10;
  const bodyTimeout = numberFlag("body-timeout", values["body-timeout"], 0.001, 86400) ?? 60;
  const keepAlive = numberFlag("keepalive", values.keepalive, 0, 86400);
  const drainTimeout = numberFlag("drain-timeout", values["drain-timeout"], 0, 86400) ?? 30;
  const apiKey = values["api-key"] ?? Deno.env.get("K3_API_KEY") ?? undefined;
  if (apiKey === "") {
    throw badInput("--api-key / K3_API_KEY is empty; give a key or leave it unset");
  }
  // A model found by repo id is named by it (the snapshot folder's name is a commit hash).
  const repoId = dir === positionals[0] ? undefined : positionals[0];
  const modelNames = modelNamesOf(dir, values["model-name"], repoId);
  const corsOrigins = corsFlags(values.cors);
  const speculation = speculationFlags(values);
  const context = contextFlag(values.context, values);
  return {
    dir,
    context,
    maxBatch,
    retain,
    passTokens,
    speculation,
    draftLimit: speculation?.draftMax ?? DEFAULT_DRAFT_MAX,
    drainTimeout,
    listen: {
      hostname: values.host!,
      port,
      apiKey,
      maxBodyBytes: maxBody,
      maxConnections,
      headerTimeoutMs: headerTimeout * 1000,
      bodyTimeoutMs: bodyTimeout * 1000,
      keepAliveSeconds: keepAlive,
      modelNames,
      corsOrigins,
    },
  };
}

/** How passes are sized, for the start message. */
function passesText(batcher: Session["batcher"]): string {
  const alone = `${batcher.passCap} alone`;
  return batcher.budget.byCost
    ? `prompt tokens per pass by measured cost (${batcher.passTokens} until measured, ${alone})`
    : `${batcher.passTokens} tokens per pass (${alone})`;
}

/** The server's settings, its warnings, and the URL it listens on (on stdout). */
function announce(flags: ServeFlags, engine: Engine, session: Session, server: K3Server): void {
  const { hostname, apiKey, modelNames } = flags.listen;
  const c = engine.model.config;
  console.error(
    `k3 serve: model ${modelNames.join(", ")} (${flags.dir}), context ${flags.context} tokens ` +
      `(sequence state up to ${
        formatBytes(stateBytes(c, c.numLayers, flags.context))
      } per request), batch of ${engine.batch.sequences}, ${passesText(session.batcher)}, ` +
      `${engine.batch.retained} retained states`,
  );
  if (apiKey === undefined) {
    console.error(
      "k3 serve: WARNING: no API key set (--api-key or K3_API_KEY): anyone who can reach the port can use it",
    );
  }
  if (!isLoopback(hostname!)) {
    console.error(`k3 serve: WARNING: bound to ${hostname}, reachable from other machines`);
  }
  console.log(`k3 serve: listening on ${server.url}/v1`);
}

/** An integer flag, or undefined when absent. */
function optionalInt(name: string, value: string | undefined, min: number, max: number) {
  return value === undefined ? undefined : intFlag(name, value, min, min, max);
}

/** startServer, with the usual socket failures turned into bad input naming the flag. */
async function listen(...args: Parameters<typeof startServer>): Promise<K3Server> {
  const { hostname, port } = args[1];
  try {
    return await startServer(...args);
  } catch (e) {
    if (e instanceof Deno.errors.AddrInUse) {
      throw badInput(`--port ${port}: ${hostname}:${port} is already in use; pick another port`);
    }
    if (e instanceof Deno.errors.PermissionDenied || e instanceof Deno.errors.AddrNotAvailable) {
      throw badInput(`--host ${hostname} --port ${port}: cannot bind (${(e as Error).message})`);
    }
    throw e;
  }
}

/**
 * The model's names on the API: --model-name values, else "kimi-k3" and the folder's name
 * (or the repo id, for a model found in the Hub cache by one).
 */
export function modelNamesOf(
  dir: string,
  given: string[] | undefined,
  repoId?: string,
): string[] {
  if (given && given.some((n) => n.trim() === "")) throw badInput("--model-name wants a name");
  const names = given?.length
    ? given
    : [DEFAULT_MODEL_NAME, repoId ?? path.basename(path.resolve(dir))];
  return [...new Set(names)];
}

/** --cors origins: `*` or `scheme://host[:port]`, as a browser sends them in Origin. */
function corsFlags(values: string[] | undefined): string[] {
  for (const origin of values ?? []) {
    if (origin !== "*" && !/^[a-z][a-z0-9+.-]*:\/\/[^/\s]+$/i.test(origin)) {
      throw badInput(
        `--cors ${origin}: an origin is scheme://host[:port] with no path ` +
          "(e.g. http://localhost:3000), or * for any",
      );
    }
  }
  return values ?? [];
}

/** True for addresses only this machine can reach. */
export function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/**
 * The signals that stop the server: SIGINT and SIGTERM; on Windows, where Deno listens for
 * neither SIGTERM nor SIGQUIT, SIGINT (Ctrl-C) and SIGBREAK (Ctrl-Break, a console closing).
 */
const STOP_SIGNALS: Deno.Signal[] = Deno.build.os === "windows"
  ? ["SIGINT", "SIGBREAK"]
  : ["SIGINT", "SIGTERM"];

/** Resolves on the first stop signal. */
function untilSignal(): Promise<void> {
  return new Promise((resolve) => {
    const stop = () => {
      for (const s of STOP_SIGNALS) Deno.removeSignalListener(s, stop);
      resolve();
    };
    for (const s of STOP_SIGNALS) Deno.addSignalListener(s, stop);
  });
}
