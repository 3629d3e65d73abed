/**
 * Where the Hub is and who we are to it, the way the Hub's own tools decide: `HF_ENDPOINT`
 * for the endpoint; `HF_TOKEN` (or the older `HUGGING_FACE_HUB_TOKEN`), else the token file
 * (`HF_TOKEN_PATH`, else `$HF_HOME/token`, else `$XDG_CACHE_HOME/huggingface/token`, else
 * `~/.cache/huggingface/token`). The token itself is never printed: messages name its source.
 */
import * as os from "node:os";
import * as path from "node:path";
import { badInput } from "../errors.ts";
import { readUserTextSync } from "../io/files.ts";

const DEFAULT_ENDPOINT = "https://huggingface.co";

/** A token and where it came from ("HF_TOKEN", or the file's path), for messages. */
export interface HubToken {
  value: string;
  source: string;
}

/** The Hub endpoint: `HF_ENDPOINT` without a trailing slash, else huggingface.co. */
export function hubEndpoint(env = Deno.env.toObject()): string {
  const raw = (env.HF_ENDPOINT ?? "").trim() || DEFAULT_ENDPOINT;
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw badInput(`HF_ENDPOINT '${raw}' is not a URL (e.g. https://huggingface.co)`);
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") {
    throw badInput(`HF_ENDPOINT '${raw}' must be an http(s) URL`);
  }
  return raw.replace(/\/+$/, "");
}

/** `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`. */
function hfHome(env = Deno.env.toObject()): string {
  if (env.HF_HOME) return env.HF_HOME;
  return path.join(env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache"), "huggingface");
}

/*
 * The Hub cache's place and folder names, as @huggingface/hub's getHFHubCachePath and
 * getRepoFolderName compute them (tests/hub/hub.test.ts checks they agree). Written out here
 * because run, chat, serve and mod.ts look up repo ids on every start, and importing the
 * library costs them about 130 ms; only download and its API calls load it.
 */

/** `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub` (see {@link hfHome}). */
export function hubCachePath(env = Deno.env.toObject()): string {
  return env.HF_HUB_CACHE ?? env.HUGGINGFACE_HUB_CACHE ?? path.join(hfHome(env), "hub");
}

/** `models--owner--name`, the cache folder of a model repo. */
export function repoFolderName(repo: string): string {
  return ["models", ...repo.split("/")].join("--");
}

/** A token is tens of bytes; its file holds one. */
const MAX_TOKEN_FILE_BYTES = 64 << 10;

/** The token to send, or undefined for anonymous access. */
export function hubToken(env = Deno.env.toObject()): HubToken | undefined {
  for (const name of ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]) {
    const value = env[name]?.trim();
    if (value) return checked({ value, source: name });
  }
  const file = env.HF_TOKEN_PATH || path.join(hfHome(env), "token");
  // A FIFO or a device is refused, never opened: reading it would hang or never end.
  const text = readUserTextSync(file, "the Hub token file", {
    limit: MAX_TOKEN_FILE_BYTES,
    missingOk: true,
  });
  if (text === null) return undefined;
  const value = text.trim();
  return value ? checked({ value, source: file }) : undefined;
}

/** A token must be one line of visible ASCII (it goes into a header). */
function checked(token: HubToken): HubToken {
  if (!/^[\x21-\x7e]+$/.test(token.value)) {
    throw badInput(`the Hub token from ${token.source} has spaces or control characters`);
  }
  return token;
}

/** `text` with every occurrence of the token replaced, for anything that may be shown. */
export function redact(text: string, token: HubToken | undefined): string {
  return token ? text.split(token.value).join("hf_***") : text;
}
