/**
 * A subcommand's flags checked before it runs, in k3's words instead of node:util's: an
 * unknown flag is named with the command and the flag meant (the flags people bring from
 * llama.cpp, vLLM and Ollama, then near-misses by edit distance), a flag missing its value or
 * given one it does not take says so. Each is bad input (exit 2).
 */
import { badInput } from "../errors.ts";

/** A subcommand's parseArgs option specs, as main.ts loads them. */
export type FlagSpecs = Record<string, { type: "string" | "boolean"; short?: string }>;

/**
 * Flags of other engines: the k3 flags that do the job, first one the command has wins; or,
 * where k3 has no such flag, what to do instead.
 */
interface Foreign {
  flags?: string[];
  /** Advice, or advice per command ("*": any other command). */
  instead?: string | Record<string, string>;
}

/** Per request, not per server: said where serve is asked for a generation setting. */
const PER_REQUEST = "k3 serve takes it per request, in the request body";

const MAX_TOKENS: Foreign = {
  flags: ["gen", "max-tokens"],
  instead: { serve: `${PER_REQUEST} (max_tokens)` },
};
const CONTEXT: Foreign = {
  flags: ["context"],
  instead: "k3 run sizes the context to the prompt plus --gen; chat and serve take --context",
};
const MODEL: Foreign = {
  instead: "the model folder (or Hub repo id) is the first argument: k3 COMMAND MODEL_DIR ...",
};
const GPU: Foreign = {
  instead: "k3 runs on the CPU, streaming weights from disk; --preset or --memory-max sets " +
    "how much memory it uses",
};
const LISTEN: Foreign = { flags: ["port"], instead: "only k3 serve listens: k3 serve MODEL_DIR" };

const FOREIGN: Record<string, Foreign> = {
  "-p": {
    flags: ["prompt"],
    instead: {
      chat: "type the message at the chat's prompt, or pipe it in",
      serve: `${PER_REQUEST} (messages or prompt)`,
    },
  },
  "-f": { flags: ["prompt-file"] },
  "--file": { flags: ["prompt-file"] },
  "-n": MAX_TOKENS,
  "--n-predict": MAX_TOKENS,
  "--predict": MAX_TOKENS,
  "--num-predict": MAX_TOKENS,
  "--max-new-tokens": MAX_TOKENS,
  "--max-length": MAX_TOKENS,
  "-c": CONTEXT,
  "--ctx-size": CONTEXT,
  "--n-ctx": CONTEXT,
  "--num-ctx": CONTEXT,
  "--max-model-len": CONTEXT,
  "--served-model-name": {
    flags: ["model-name"],
    instead: { "*": "a model name matters only to k3 serve (--model-name)" },
  },
  "--alias": { flags: ["model-name"] },
  "-a": { flags: ["model-name"] },
  "-m": MODEL,
  "--model": MODEL,
  "--hf-repo": MODEL,
  "-hf": MODEL,
  "--temp": { flags: ["temperature"] },
  "-t": { flags: ["threads"] },
  "--n-threads": { flags: ["threads"] },
  "--num-thread": { flags: ["threads"] },
  "-s": { flags: ["seed"] },
  "--repeat-penalty": { flags: ["repetition-penalty"] },
  "--port": LISTEN,
  "--host": { flags: ["host"], instead: LISTEN.instead },
  "--max-num-seqs": { flags: ["max-batch"] },
  "-np": { flags: ["max-batch"] },
  "--parallel": { flags: ["max-batch"] },
  "-sys": { flags: ["system"] },
  "--system-prompt": { flags: ["system"] },
  "-r": { flags: ["stop"] },
  "--reverse-prompt": { flags: ["stop"] },
  "-j": { flags: ["json-schema"] },
  "--grammar-file": { flags: ["grammar"] },
  "-ngl": GPU,
  "--n-gpu-layers": GPU,
  "--gpu-layers": GPU,
  "--gpu-memory-utilization": GPU,
  "--tensor-parallel-size": GPU,
  "-tp": GPU,
  "--device": GPU,
  "-i": { instead: "for a conversation, use k3 chat MODEL_DIR" },
  "-cnv": { instead: "for a conversation, use k3 chat MODEL_DIR" },
  "--interactive": { instead: "for a conversation, use k3 chat MODEL_DIR" },
  "--stream": { flags: ["quiet"], instead: "answers always stream" },
};

/**
 * Throws bad input for the first flag in `args` that `command` does not take, or that lacks
 * or wrongly carries a value. Arguments after `--` are positionals and never checked.
 */
export function checkFlags(command: string, args: readonly string[], specs: FlagSpecs): void {
  const shorts = new Map(
    Object.entries(specs).flatMap(([name, s]) => s.short ? [[s.short, name]] : []),
  );
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--") return;
    if (!isFlag(arg)) continue;
    const eq = arg.indexOf("=");
    const raw = arg.startsWith("--") && eq > 0 ? arg.slice(0, eq) : arg;
    const name = arg.startsWith("--") ? raw.slice(2) : shorts.get(arg.slice(1));
    const spec = name === undefined ? undefined : specs[name];
    if (!spec || !Object.hasOwn(specs, name!)) throw unknownFlag(command, raw, specs);
    if (spec.type === "boolean") {
      if (raw !== arg) throw badInput(`${raw} takes no value (got ${arg}) ${helpHint(command)}`);
      continue;
    }
    if (raw !== arg) continue; // --flag=value
    const value = args[i + 1];
    if (value === undefined || value === "--") {
      throw badInput(`${raw} needs a value ${helpHint(command)}`);
    }
    if (isFlag(value)) {
      throw badInput(
        `${raw} needs a value, and ${value} is a flag: give ${raw} its value (or ` +
          `${raw}=VALUE for one that starts with -) ${helpHint(command)}`,
      );
    }
    i++;
  }
}

/** `-x`, `--xy`, `--xy=1`; not `-`, a negative number, or plain text. */
function isFlag(arg: string): boolean {
  return arg.length > 1 && arg.startsWith("-") && !/^-\.?\d/.test(arg);
}

function helpHint(command: string): string {
  return `(k3 ${command} --help)`;
}

/** "unknown flag -p for k3 run; did you mean --prompt? (k3 run --help)", or what to do. */
function unknownFlag(command: string, flag: string, specs: FlagSpecs) {
  const head = `unknown flag ${flag} for k3 ${command}`;
  const meant = suggestion(flag, specs);
  if (typeof meant === "string") {
    return badInput(`${head}; did you mean ${meant}? ${helpHint(command)}`);
  }
  const advice = meant?.instead;
  const instead = (typeof advice === "string" ? advice : advice?.[command] ?? advice?.["*"])
    ?.replace("COMMAND", command);
  return badInput(`${head}${instead ? `: ${instead}` : ""} ${helpHint(command)}`);
}

/** The flag meant (as `--name`), or a Foreign entry's advice, or nothing. */
function suggestion(flag: string, specs: FlagSpecs): string | Foreign | undefined {
  const known = Object.keys(specs).filter((f) => f !== "help");
  const foreign = FOREIGN[flag] ?? FOREIGN[flag.replaceAll("_", "-")];
  const mapped = foreign?.flags?.find((f) => known.includes(f));
  if (mapped) return `--${mapped}`;
  if (foreign) return foreign;
  // --max_tokens, -max-tokens, --Temperature: the same flag spelt another way.
  const plain = flag.replace(/^-+/, "").replaceAll("_", "-").toLowerCase();
  if (known.includes(plain)) return `--${plain}`;
  let best: string | undefined, bestDistance = Infinity;
  for (const f of known) {
    const d = editDistance(plain, f);
    if (d < bestDistance) [best, bestDistance] = [f, d];
  }
  // A typo is a letter or two, and never most of a short word.
  const allowed = Math.min(2, Math.floor(plain.length / 4));
  return best !== undefined && bestDistance <= allowed ? `--${best}` : undefined;
}

/** Levenshtein distance: insertions, deletions and substitutions to turn `a` into `b`. */
export function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      const substitute = row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1);
      next.push(Math.min(row[j] + 1, next[j - 1] + 1, substitute));
    }
    row = next;
  }
  return row[b.length];
}
