/**
 * Subcommand dispatch and the one place where errors become exit codes.
 */
import { ExitCode, K3Error } from "../errors.ts";
import { VERSION } from "../version.ts";

type Command = (args: string[]) => Promise<number>;

/** Subcommands, loaded on demand so `--help` never touches libk3. */
const commands: Record<string, { summary: string; load: () => Promise<Command> }> = {
  run: {
    summary: "generate from a prompt (--ids, --prompt, --prompt-file)",
    load: async () => (await import("./run.ts")).runCommand,
  },
  "make-tiny": {
    summary: "write a random-weight checkpoint in the released layout",
    load: async () => (await import("./make_tiny.ts")).makeTinyCommand,
  },
  demo: {
    summary: "text in, text out on the built-in tiny model",
    load: async () => (await import("./demo.ts")).demoCommand,
  },
};

export const USAGE = `k3 ${VERSION}: Kimi K3 on the machine you own

usage: k3 <command> [options]        k3 <command> --help for its options

commands:
${Object.entries(commands).map(([n, c]) => `  ${n.padEnd(12)} ${c.summary}`).join("\n")}

exit codes: 0 ok, 1 internal error, 2 bad input or config, 3 over the memory budget,
            4 run invalid (a read or integrity failure), 130 interrupted
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
  const command = commands[name];
  if (!command) {
    console.error(`k3: unknown command '${name}'\n\n${USAGE}`);
    return ExitCode.badInput;
  }
  try {
    return await (await command.load())(rest);
  } catch (e) {
    return reportError(e);
  }
}

/** Prints an error the way users should see it and returns its exit code. */
export function reportError(e: unknown): number {
  if (e instanceof K3Error) {
    console.error(`k3: ${e.message}`);
    return e.exitCode;
  }
  // parseArgs errors: unknown flags, missing values.
  if (e instanceof TypeError && "code" in e && String(e.code).startsWith("ERR_PARSE_ARGS")) {
    console.error(`k3: ${e.message}`);
    return ExitCode.badInput;
  }
  console.error("k3: internal error (please report):", e);
  return ExitCode.internal;
}
