/**
 * Errors that reach the user. Each carries the process exit code documented in
 * docs/CLI.md, so the CLI can map any failure to the right code without guessing.
 */

/** Documented exit codes. */
export const ExitCode = {
  ok: 0,
  /** An internal error: a bug in k3. */
  internal: 1,
  /** Bad input: flags, config, checkpoint layout, tokenizer files, prompt. */
  badInput: 2,
  /** The memory plan does not fit the budget. */
  overBudget: 3,
  /** The run is invalid: a read failed, came back short, or data failed an integrity check. */
  runInvalid: 4,
  /**
   * The network failed: a server (the Hugging Face Hub, its storage) could not be reached,
   * or kept failing, for longer than the command was told to retry. Nothing is wrong with
   * what is on disk; the same command, re-run, resumes.
   */
  network: 5,
  /** Interrupted by the user (SIGINT). */
  interrupted: 130,
} as const;

/** One of the documented exit codes. */
export type ExitCodeValue = (typeof ExitCode)[keyof typeof ExitCode];

/**
 * One change that would let a refused request through: the option to change, by the name
 * the library's options give it, and what to do in words a script and a command-line user
 * both understand (the words appear in the message as they are; the CLI adds its flag).
 */
export interface Remedy {
  /** The option, e.g. `memoryMaxGb` or `preset`. */
  readonly option: string;
  /** What to do, e.g. "a memory budget of at least 3.1 GB". */
  readonly words: string;
}

/** What a {@link K3Error} may carry besides its cause. */
export interface K3ErrorOptions extends ErrorOptions {
  /** The changes that would help, each named in the message by its words. */
  remedies?: readonly Remedy[];
}

/** A failure with a message meant for the user and the exit code it maps to. */
export class K3Error extends Error {
  /** The changes that would help (empty when the message names none). */
  readonly remedies: readonly Remedy[];

  /** `exitCode`: what the CLI exits with for this failure. */
  constructor(message: string, readonly exitCode: ExitCodeValue, options?: K3ErrorOptions) {
    super(message, options);
    this.name = "K3Error";
    this.remedies = options?.remedies ?? [];
  }
}

/** Bad input (exit 2): name the file, the field, and what to do. */
export function badInput(message: string, options?: K3ErrorOptions): K3Error {
  return new K3Error(message, ExitCode.badInput, options);
}

/** Over the memory budget (exit 3). */
export function overBudget(message: string, options?: K3ErrorOptions): K3Error {
  return new K3Error(message, ExitCode.overBudget, options);
}

/** A read or integrity failure (exit 4); the message starts with RUN INVALID. */
export function runInvalid(message: string, options?: ErrorOptions): K3Error {
  return new K3Error(`RUN INVALID: ${message}`, ExitCode.runInvalid, options);
}

/** A network failure (exit 5): the message says what could not be reached and what to do. */
export function networkFailure(message: string, options?: K3ErrorOptions): K3Error {
  return new K3Error(message, ExitCode.network, options);
}
