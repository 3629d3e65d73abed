/**
 * `k3 serve MODEL_DIR [--host H] [--port P] [--api-key KEY] ...`: the OpenAI-compatible server,
 * in this process, on one shared engine.
 */
import { parseArgs } from "node:util";
import * as path from "node:path";
import { badInput, ExitCode } from "../errors.ts";
import { stateBytes } from "../memory/plan.ts";
import { formatBytes } from "../report.ts";
import { type K3Server, startServer } from "../serve/server.ts";
import { Session } from "../session.ts";
import { Tokenizer } from "../text/tokenizer.ts";
import { applyThreads, helpAsked, intFlag, modelDirArg, numberFlag } from "./flags.ts";
import {
  contextFlag,
  contextShape,
  DEFAULT_CONTEXT,
  listPresetsIfAsked,
  loadPlanned,
  MEMORY_HELP,
  MEMORY_OPTIONS,
  PREFILL_CHUNK,
} from "./memory_flags.ts";
import { openCheckpoint } from "../checkpoint/checkpoint.ts";
import { stopIdsOf } from "./run.ts";

const DEFAULT_MAX_BODY = 8 * 1024 * 1024;

const HELP = `usage: k3 serve MODEL_DIR [options]

An OpenAI-compatible HTTP server (GET /v1/models, POST /v1/chat/completions,
POST /v1/completions, GET /health) on one engine shared by every client; requests are
served one at a time in arrival order.

  --host HOST        address to bind (default 127.0.0.1; anything else exposes the model
                     to the network: set an API key)
  --port N           port (default 8080; 0 picks a free one, printed at start)
  --api-key KEY      require "Authorization: Bearer KEY" on /v1 (default: $K3_API_KEY)
  --context N        prompt + completion tokens per request (default ${DEFAULT_CONTEXT})
  --max-body BYTES   largest request body (default ${DEFAULT_MAX_BODY})
  --retain N         conversation states kept for reuse by follow-up turns (default 4)
  --max-connections N  connections served at once; more get a 503 (default 128)
  --header-timeout S   seconds for a request head to arrive, idle keep-alive included
                       (default 10)
  --body-timeout S     seconds for a request body to arrive (default 60)
  --threads N        OpenMP threads (default: OMP_NUM_THREADS or all cores)
${MEMORY_HELP}
`;

export async function serveCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    strict: true,
    options: {
      host: { type: "string", default: "127.0.0.1" },
      port: { type: "string" },
      "api-key": { type: "string" },
      context: { type: "string" },
      "max-body": { type: "string" },
      retain: { type: "string" },
      "max-connections": { type: "string" },
      "header-timeout": { type: "string" },
      "body-timeout": { type: "string" },
      threads: { type: "string" },
      ...MEMORY_OPTIONS,
      help: { type: "boolean", short: "h" },
    },
  });
  if (helpAsked(values, HELP)) return ExitCode.ok;
  if (listPresetsIfAsked(values)) return ExitCode.ok;
  const dir = modelDirArg(positionals, "serve");
  const port = intFlag("port", values.port, 8080, 0, 65535);
  const maxBody = intFlag("max-body", values["max-body"], DEFAULT_MAX_BODY, 1);
  const retain = intFlag("retain", values.retain, 4, 0, 1024);
  const maxConnections = intFlag("max-connections", values["max-connections"], 128, 1, 65536);
  const headerTimeout = numberFlag("header-timeout", values["header-timeout"], 0.001, 86400) ?? 10;
  const bodyTimeout = numberFlag("body-timeout", values["body-timeout"], 0.001, 86400) ?? 60;
  const apiKey = values["api-key"] ?? Deno.env.get("K3_API_KEY") ?? undefined;
  if (apiKey === "") {
    throw badInput("--api-key / K3_API_KEY is empty; give a key or leave it unset");
  }
  applyThreads(values.threads);

  const tokenizer = await Tokenizer.load(dir);
  const contextTokens = contextFlag(values.context, values);
  const { model } = await loadPlanned(await openCheckpoint(dir), values, {
    shape: contextShape(contextTokens),
    log: (line) => console.error(line),
  });
  const session = new Session(model, { retain, prefillChunk: PREFILL_CHUNK });
  const server = await listen(
    { session, tokenizer, stopIds: stopIdsOf(model, tokenizer) },
    {
      hostname: values.host!,
      port,
      apiKey,
      maxBodyBytes: maxBody,
      maxConnections,
      headerTimeoutMs: headerTimeout * 1000,
      bodyTimeoutMs: bodyTimeout * 1000,
      contextTokens,
      modelId: modelIdOf(dir),
    },
  );
  console.error(
    `k3 serve: model ${modelIdOf(dir)} (${dir}), context ${contextTokens} tokens ` +
      `(sequence state up to ${
        formatBytes(stateBytes(model.config, model.config.numLayers, contextTokens))
      } per request)`,
  );
  if (apiKey === undefined) {
    console.error(
      "k3 serve: WARNING: no API key set (--api-key or K3_API_KEY): anyone who can reach the port can use it",
    );
  }
  if (!isLoopback(values.host!)) {
    console.error(`k3 serve: WARNING: bound to ${values.host}, reachable from other machines`);
  }
  console.log(`k3 serve: listening on ${server.url}/v1`);

  await untilSignal();
  console.error("k3 serve: shutting down");
  await server.shutdown();
  model.close();
  tokenizer.free();
  return ExitCode.ok;
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

/** The model's name on the API: the checkpoint folder's name. */
export function modelIdOf(dir: string): string {
  return path.basename(path.resolve(dir));
}

/** True for addresses only this machine can reach. */
export function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** Resolves on SIGINT or SIGTERM. */
function untilSignal(): Promise<void> {
  return new Promise((resolve) => {
    const stop = () => {
      Deno.removeSignalListener("SIGINT", stop);
      Deno.removeSignalListener("SIGTERM", stop);
      resolve();
    };
    Deno.addSignalListener("SIGINT", stop);
    Deno.addSignalListener("SIGTERM", stop);
  });
}
