/**
 * Subcommand dispatch and the one place where errors become exit codes.
 */
import { ExitCode, K3Error } from "../errors.ts";
import { LibraryLoadError } from "../../ffi/library.ts";
import { VERSION } from "../version.ts";
import { checkFlags } from "./flag_check.ts";
import { joinNegativeValues } from "./flags.ts";
import { withFlagNames } from "./remedies.ts";

type Command = (args: string[]) => Promise<number>;

/** A subcommand's parseArgs option specs (its `OPTIONS` export). */
type CommandOptions = Record<string, { type: "string" | "boolean"; short?: string }>;

interface CommandEntry {
  summary: string;
  load: () => Promise<Command>;
  /** The flags it parses (tests/repo/cli_docs.test.ts holds docs/CLI.md to them). */
  options: () => Promise<CommandOptions>;
}

/** Subcommands, loaded on demand so `--help` never touches libk3. */
const commands: Record<string, CommandEntry> = {
  run: {
    summary: "generate from a prompt (--ids, --prompt, --prompt-file)",
    load: async () => (await import("./run.ts")).runCommand,
    options: async () => (await import("./run.ts")).OPTIONS,
  },
  chat: {
    summary: "chat on the XTML format, with durable history (--history FILE.jsonl)",
    load: async () => (await import("./chat.ts")).chatCommand,
    options: async () => (await import("./chat.ts")).OPTIONS,
  },
  "make-tiny": {
    summary: "write a random-weight checkpoint in the released layout",
    load: async () => (await import("./make_tiny.ts")).makeTinyCommand,
    options: async () => (await import("./make_tiny.ts")).OPTIONS,
  },
  pack: {
    summary: "pack the trunk into one aligned run per layer (for run --trunk)",
    load: async () => (await import("./pack.ts")).packCommand,
    options: async () => (await import("./pack.ts")).OPTIONS,
  },
  "sim-cache": {
    summary: "replay an expert trace under LRU, Belady and pinned+LRU at several sizes",
    load: async () => (await import("./sim_cache.ts")).simCacheCommand,
    options: async () => (await import("./sim_cache.ts")).OPTIONS,
  },
  bench: {
    summary: "kernel and model speed against the measured memory bandwidth",
    load: async () => (await import("./bench.ts")).benchCommand,
    options: async () => (await import("./bench.ts")).OPTIONS,
  },
  doctor: {
    summary: "this machine, and which memory presets fit a checkpoint here",
    load: async () => (await import("./doctor.ts")).doctorCommand,
    options: async () => (await import("./doctor.ts")).OPTIONS,
  },
  demo: {
    summary: "text in, text out on the built-in tiny model",
    load: async () => (await import("./demo.ts")).demoCommand,
    options: async () => (await import("./demo.ts")).OPTIONS,
  },
  serve: {
    summary: "HTTP server: OpenAI, Responses, Anthropic and Ollama APIs (streaming, tools)",
    load: async () => (await import("./serve.ts")).serveCommand,
    options: async () => (await import("./serve.ts")).OPTIONS,
  },
  download: {
    summary: "the checkpoint from the Hugging Face Hub: resumable, parallel, verified",
    load: async () => (await import("./download.ts")).downloadCommand,
    options: async () => (await import("./download.ts")).OPTIONS,
  },
  verify: {
    summary: "check a downloaded model against its manifest (sizes, SHA-256)",
    load: async () => (await import("./verify.ts")).verifyCommand,
    options: async () => (await import("./verify.ts")).OPTIONS,
  },
};

/** The subcommands' names, in `k3 --help` order. */
export const COMMAND_NAMES: readonly string[] = Object.keys(commands);

/** The flags subcommand `name` parses. */
export function commandOptions(name: string): Promise<CommandOptions> {
  return commands[name].options();
}

const USAGE = `k3 ${VERSION}: Kimi K3 on the machine you own

usage: k3 <command> [options]        k3 <command> --help for its options
       k3 --list-presets             the memory presets, and what auto picks here

commands:
${Object.entries(commands).map(([n, c]) => `  ${n.padEnd(12)} ${c.summary}`).join("\n")}

exit codes: 0 ok, 1 internal error, 2 bad input or config, 3 over the memory budget,
            4 run invalid (a read or integrity failure), 5 network failure (download),
            130 interrupted
`;

/** Runs the CLI; returns the process exit code. */
export async function main(args: string[]): Promise<number> {
  const [name, ...rest] = args;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    console.log(USAGE);
    return name === undefined ? ExitCode.badInput : ExitCode.ok;
  }
  if (name === "--version" || name === "-V") {
    console.log(`k3 ${VERSION}`);
    return ExitCode.ok;
  }
  if (name === "--list-presets") {
    try {
      (await import("./memory_flags.ts")).listPresetsIfAsked({ "list-presets": true });
      return ExitCode.ok;
    } catch (e) {
      return reportError(e);
    }
  }
  const command = Object.hasOwn(commands, name) ? commands[name] : undefined;
  if (!command && name.startsWith("-")) {
    // `k3 -m DIR -p hi`, as llama.cpp takes it: the command is missing, not the flag.
    console.error(
      `k3: unknown flag ${name}: the command comes first, then MODEL_DIR and its flags ` +
        `(k3 run MODEL_DIR "TEXT"; k3 --help lists the commands)`,
    );
    return ExitCode.badInput;
  }
  if (!command) {
    console.error(`k3: unknown command '${name}'\n\n${USAGE}`);
    return ExitCode.badInput;
  }
  try {
    const args = joinNegativeValues(rest);
    checkFlags(name, args, await command.options());
    return await (await command.load())(args);
  } catch (e) {
    return reportError(e);
  }
}

/** Prints an error the way users should see it and returns its exit code. */
function reportError(e: unknown): number {
  if (e instanceof K3Error) {
    console.error(`k3: ${withFlagNames(e)}`);
    return e.exitCode;
  }
  if (e instanceof LibraryLoadError) {
    console.error(`k3: ${e.message}`);
    return ExitCode.badInput;
  }
  // parseArgs errors: unknown flags, missing values.
  if (e instanceof TypeError && "code" in e && String(e.code).startsWith("ERR_PARSE_ARGS")) {
    console.error(`k3: ${e.message}`);
    return ExitCode.badInput;
  }
  console.error("k3: internal error (please report):", e);
  return ExitCode.internal;
}
