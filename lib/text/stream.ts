/**
 * Generated ids to printable text: the streaming detokeniser followed by the stop-string
 * matcher, so no half character and no part of a stop string is ever shown. Shared by
 * `k3 run` and `k3 chat`.
 */
import type { StreamDecoder } from "./tokenizer.ts";
import { StopMatcher, type StopResult } from "./stops.ts";

/** Decodes ids one at a time and ends at the first --stop string. */
export class TextStream {
  readonly #decoder: StreamDecoder;
  readonly #stops: StopMatcher;

  constructor(decoder: StreamDecoder, stops: string[] = []) {
    this.#decoder = decoder;
    this.#stops = new StopMatcher(stops);
  }

  /** The text this token makes safe to show; `stopped` once a stop string completed. */
  push(id: number): StopResult {
    return this.#stops.push(this.#decoder.push(id));
  }

  /** End of generation: held bytes (as U+FFFD) and a held partial stop string. */
  flush(): string {
    const last = this.#stops.push(this.#decoder.flush());
    return last.stopped ? last.emit : last.emit + this.#stops.flush();
  }
}
