/**
 * A real pseudo-terminal for tests: a private tmux server runs one command in a pane; the
 * test types keys (send-keys, paste-buffer) and reads the screen (capture-pane), as a person
 * at a terminal would. Each Tty has its own server socket in a temp folder, removed at close.
 */
import * as path from "node:path";

const decoder = new TextDecoder();

/** Quotes one word for sh. */
function shellQuote(word: string): string {
  return `'${word.replaceAll("'", `'\\''`)}'`;
}

export class Tty {
  readonly #socket: string;
  readonly #dir: string;

  private constructor(dir: string) {
    this.#dir = dir;
    this.#socket = path.join(dir, "tmux.sock");
  }

  /**
   * Starts `argv` in a `cols` x `rows` pane. When the command ends the shell prints
   * `[exit N]` on the next line, so a missing final newline shows on the screen.
   */
  static async start(
    argv: string[],
    options: { cols?: number; rows?: number; env?: Record<string, string> } = {},
  ): Promise<Tty> {
    const dir = Deno.makeTempDirSync({ prefix: "k3-tty-" });
    const tty = new Tty(dir);
    const conf = path.join(dir, "tmux.conf");
    await Deno.writeTextFile(conf, "set -g remain-on-exit on\nset -g history-limit 5000\n");
    const env = Object.entries(options.env ?? {}).map(([k, v]) => `${k}=${shellQuote(v)} `);
    const command = `${env.join("")}${argv.map(shellQuote).join(" ")}; echo "[exit $?]"`;
    await tty.tmux(
      "-f",
      conf,
      "new-session",
      "-d",
      "-x",
      String(options.cols ?? 100),
      "-y",
      String(options.rows ?? 40),
      command,
    );
    return tty;
  }

  /** Runs a tmux command on this server; returns its stdout. */
  async tmux(...args: string[]): Promise<string> {
    const out = await new Deno.Command("tmux", {
      args: ["-S", this.#socket, ...args],
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!out.success) {
      throw new Error(`tmux ${args.join(" ")}: ${decoder.decode(out.stderr)}`);
    }
    return decoder.decode(out.stdout);
  }

  /** Presses keys by tmux name ("Enter", "C-a", "Home", "M-Enter"); text in quotes is typed. */
  async keys(...keys: string[]): Promise<void> {
    await this.tmux("send-keys", ...keys);
  }

  /** Types `text` literally (no key names). */
  async type(text: string): Promise<void> {
    await this.tmux("send-keys", "-l", text);
  }

  /** Pastes `text` as a terminal does, inside bracketed-paste markers when the app asked. */
  async paste(text: string): Promise<void> {
    await this.tmux("set-buffer", "-b", "k3test", text);
    await this.tmux("paste-buffer", "-p", "-d", "-b", "k3test");
  }

  /**
   * From now on, everything the command writes to the terminal (redraws included, which the
   * screen no longer shows) is appended to a file; {@link recorded} reads it.
   */
  async record(): Promise<void> {
    const file = path.join(this.#dir, "output.raw");
    await this.tmux("pipe-pane", "-o", `cat >> ${shellQuote(file)}`);
  }

  /** What {@link record} captured so far, as text. */
  recorded(): string {
    try {
      return Deno.readTextFileSync(path.join(this.#dir, "output.raw"));
    } catch {
      return "";
    }
  }

  /** The whole screen and scrollback, wrapped lines joined, trailing blank lines dropped. */
  async screen(): Promise<string> {
    const text = await this.tmux("capture-pane", "-p", "-J", "-S", "-");
    return text.replace(/\n+$/, "\n");
  }

  /** Waits until the screen satisfies `test` (a regex or a predicate); returns the screen. */
  async waitFor(
    test: RegExp | ((screen: string) => boolean),
    timeoutMs = 30_000,
  ): Promise<string> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const screen = await this.screen();
      if (typeof test === "function" ? test(screen) : test.test(screen)) return screen;
      if (Date.now() > until) throw new Error(`timed out waiting for ${test}; screen:\n${screen}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Waits for the command to end; returns its exit status. */
  async exitCode(timeoutMs = 30_000): Promise<number> {
    const screen = await this.waitFor(/^\[exit \d+\]$/m, timeoutMs);
    return Number(screen.match(/^\[exit (\d+)\]$/m)![1]);
  }

  /** Stops the server (and anything still running in it) and removes its folder. */
  async close(): Promise<void> {
    await this.tmux("kill-server").catch(() => {});
    await Deno.remove(this.#dir, { recursive: true }).catch(() => {});
  }
}
