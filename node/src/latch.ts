import { ServerError, type Connection } from './adapter.js';
import { fromReply, RLockClosed } from './errors.js';
import type { RLock } from './lock.js';
import { abortReason, bounded, now, sleep, Stalled, transientReply } from './util.js';
import * as V from './validate.js';

export interface LatchAwaitOptions {
  /** How long to wait in the server: absent waits without limit, 0 only looks. */
  waitMs?: number;
  /** Ends the wait (its connection is closed, which ends the server's wait at once). */
  signal?: AbortSignal;
}

const MAX_COUNT = Number.MAX_SAFE_INTEGER;

/**
 * A count-down latch (`rlock.latch(name)`): `RLATCH.*` on Redisson's `RCountDownLatch` layout
 * (a string holding the count; missing: open). `await()` waits in the server (`RLATCH.AWAIT`)
 * on a dedicated connection; every awaiter is answered when the latch opens.
 */
export class CountDownLatch {
  readonly #rl: RLock;
  readonly key: string | Buffer;

  /** @internal */
  constructor(rl: RLock, key: string | Buffer) {
    this.#rl = rl;
    this.key = key;
  }

  get label(): string {
    return typeof this.key === 'string' ? this.key : this.key.toString('latin1');
  }

  /** One command; `again`: sent again after transient failures (a read only: a set or a delete
   * whose reply was lost would read as not done when sent again). */
  async #call(args: (string | Buffer)[], again = false): Promise<number> {
    const rl = this.#rl;
    try {
      if (again) return Number(await rl.resend(args, now() + rl.responseTimeoutMs));
      return Number(await bounded(rl.conn.send(args), rl.responseTimeoutMs, String(args[0])));
    } catch (e) {
      if (e instanceof ServerError) throw fromReply(e.message, this.label);
      throw e;
    }
  }

  /** Sets the count if the latch does not exist (Redisson's `trySetCount`): true when set. */
  async trySetCount(count: number): Promise<boolean> {
    const n = V.int(count, 'count', 1, MAX_COUNT);
    return (await this.#call(['RLATCH.SETCOUNT', this.key, String(n)])) === 1;
  }

  /** Counts down by `amount` (default 1), never below zero; at zero the latch opens. The count
   * left. Not sent again after a failure (a count-down is not idempotent). */
  async countDown(amount = 1): Promise<number> {
    const n = V.int(amount, 'amount', 1, MAX_COUNT);
    return this.#call(['RLATCH.COUNTDOWN', this.key, String(n)]);
  }

  /** The remaining count (0: open). */
  async count(): Promise<number> {
    return this.#call(['RLATCH.COUNT', this.key], true);
  }

  /** Deletes the latch (it opens): true when it existed. */
  async delete(): Promise<boolean> {
    return (await this.#call(['RLATCH.DELETE', this.key])) === 1;
  }

  /** Waits in the server until the latch is open: true when open, false when `waitMs` passed.
   * An abort rejects with the signal's reason. A failed connection asks again with the time
   * left. */
  async await(options?: LatchAwaitOptions): Promise<boolean> {
    const o = V.options(options, 'await options');
    V.known(o, ['waitMs', 'signal'], 'await options');
    const waitMs = V.ms(o.waitMs, 'waitMs', 0);
    const signal = V.signal(o.signal);
    if (signal?.aborted) throw abortReason(signal);
    if (waitMs === 0) return (await this.count()) <= 0;
    const rl = this.#rl;
    const end = waitMs === undefined ? Infinity : now() + waitMs;
    let backoff = 20;
    const closes = rl.closes;
    for (;;) {
      const left = end === Infinity ? 0 : Math.ceil(end - now());
      if (end !== Infinity && left <= 0) return (await this.count()) <= 0;
      let conn: Connection;
      try {
        rl.checkOpen(closes);
        conn = await rl.openWait(signal, this.key);
      } catch (e) {
        // a connection that could not be opened (or not in time) is tried again with the time
        // left, as a failed one is
        if ((signal?.aborted && e === abortReason(signal)) || e instanceof RLockClosed) throw e;
        await sleep(Math.min(backoff, end - now()), signal);
        backoff = Math.min(backoff * 2, 1000);
        continue;
      }
      let clean = false;
      try {
        rl.checkOpen(closes); // closed while it was being opened: closed below
        const within = end === Infinity ? Infinity : left + rl.responseTimeoutMs;
        const reply = await bounded(conn.send(['RLATCH.AWAIT', this.key, String(left)]), within, 'RLATCH.AWAIT', signal);
        clean = true;
        return Number(reply) === 1;
      } catch (e) {
        if ((signal?.aborted && e === abortReason(signal)) || e instanceof RLockClosed) throw e;
        if (e instanceof ServerError && !transientReply(e)) throw fromReply(e.message, this.label);
        if (e instanceof Stalled) return false;
        await sleep(Math.min(backoff, end - now()), signal);
        backoff = Math.min(backoff * 2, 1000);
      } finally {
        // kept for another wait when its reply came; else closed, ending the server's wait
        if (clean) await rl.doneWait(conn);
        else await rl.closeWait(conn);
      }
    }
  }
}
