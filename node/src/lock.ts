import { randomBytes, randomUUID } from 'node:crypto';
import { adapt, ServerError, type Arg, type Connection } from './adapter.js';
import { fromReply, InvalidArgument, LockLost, LockTimeout } from './errors.js';
import * as V from './validate.js';

// Node 20 has Symbol.asyncDispose (as Symbol.for('nodejs.asyncDispose')); older runtimes get it here.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for('nodejs.asyncDispose');

const now = (): number => performance.now();
const toEpoch = (mono: number): number => performance.timeOrigin + mono;

/** How long a lock's release is sent again after transient failures (the server remembers a
 * release by its id 10 s). */
const RELEASE_RESEND_MS = 6000;
/** How long the server remembers a request's outcome without a lease (its cancelled record). */
const REQUEST_RECORD_MS = 60000;

export interface RLockOptions {
  /** How long a reply may take beyond any wait in the server (default 2000 ms). */
  responseTimeoutMs?: number;
  /** The lease of a hold taken without one, renewed every third of it (default 30000 ms). */
  watchdogMs?: number;
}

export interface AcquireOptions {
  /** How long to wait in the server: absent waits without limit, 0 is one try. */
  waitMs?: number;
  /** The hold's lease; absent: the watchdog's lease, renewed until release. */
  leaseMs?: number;
  /** Aborts the acquire: it then holds nothing (its request is cancelled in the server). */
  signal?: AbortSignal;
}

const ACQUIRE_KEYS = ['waitMs', 'leaseMs', 'signal'] as const;

/** An error reply worth sending the same idempotent command again after. */
function transientReply(e: ServerError): boolean {
  return /^(LOADING|BUSY|TRYAGAIN|MASTERDOWN|READONLY|CLUSTERDOWN)\b/.test(e.message);
}

function isTransient(e: unknown): boolean {
  return e instanceof ServerError ? transientReply(e) : !(e instanceof LockLost);
}

function isCancelledReply(e: unknown): boolean {
  return e instanceof ServerError && e.message.startsWith('ERR request ') && e.message.endsWith('was cancelled');
}

/** No reply in time. */
class Stalled extends Error {
  constructor(what: string, ms: number) {
    super(`no reply to ${what} within ${ms} ms`);
    this.name = 'Stalled';
  }
}

function newId(): string {
  return randomBytes(16).toString('hex');
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('This operation was aborted', 'AbortError');
}

/** `p`, or a rejection: `Stalled` after `ms` (Infinity: never), the signal's reason on abort. */
function bounded<T>(p: Promise<T>, ms: number, what: string, signal?: AbortSignal): Promise<T> {
  p.catch(() => {}); // settled later, perhaps never read
  return new Promise<T>((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const done = (): void => {
      if (timer !== undefined) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    const onAbort = (): void => {
      done();
      reject(abortReason(signal!));
    };
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    if (ms !== Infinity) timer = setTimeout(() => (done(), reject(new Stalled(what, ms))), Math.min(ms, V.MAX_MS));
    p.then(
      (v) => (done(), resolve(v)),
      (e: unknown) => (done(), reject(e)),
    );
  });
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return bounded(new Promise<void>((r) => setTimeout(r, Math.max(0, ms))), Infinity, 'sleep', signal);
}

/**
 * The client: one per node-redis or ioredis client (`new RLock(client)`), the user's own client
 * for short commands, and a dedicated duplicate of it for each wait in the server.
 */
export class RLock {
  /** This client's id, the first part of every owner id (`<id>:<handle>:<hold>`). */
  readonly id: string = randomUUID();
  /** @internal */ readonly conn: Connection;
  /** @internal */ readonly responseTimeoutMs: number;
  /** @internal */ readonly watchdogMs: number;
  #handles = 0;
  readonly #background = new Set<Promise<unknown>>();
  readonly #waits = new Set<Connection>();
  static readonly #cache = new WeakMap<object, RLock>();

  constructor(client: unknown, options?: RLockOptions) {
    const o = V.options(options, 'RLock options');
    V.known(o, ['responseTimeoutMs', 'watchdogMs'], 'RLock options');
    this.responseTimeoutMs = V.ms(o.responseTimeoutMs, 'responseTimeoutMs', 1) ?? 2000;
    this.watchdogMs = V.ms(o.watchdogMs, 'watchdogMs', V.MIN_WATCHDOG_MS) ?? 30000;
    this.conn = adapt(client);
  }

  /** The RLock of `client` (one per client, made at first use; `client` may be an RLock). */
  static of(client: unknown): RLock {
    if (client instanceof RLock) return client;
    if (client === null || typeof client !== 'object') return new RLock(client);
    let rl = RLock.#cache.get(client);
    if (rl === undefined) RLock.#cache.set(client, (rl = new RLock(client)));
    return rl;
  }

  /** A lock handle named `name`; its holds re-enter (per handle, not per caller). */
  lock(name: string | Buffer): Lock {
    return new Lock(this, V.name(name), `${this.id}:${++this.#handles}`);
  }

  /** Waits (at most `timeoutMs`) for cancels and releases still being sent in the background,
   * and closes the connections of waits still open. The user's client stays open. */
  async close(timeoutMs = 5000): Promise<void> {
    const all = Promise.allSettled([...this.#background]);
    await bounded(all, timeoutMs, 'close').catch(() => {});
    await Promise.allSettled([...this.#waits].map((c) => c.close()));
    this.#waits.clear();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** @internal A dedicated connection for one wait. */
  async openWait(signal?: AbortSignal): Promise<Connection> {
    const opening = this.conn.duplicate();
    let c: Connection;
    try {
      c = await bounded(opening, this.responseTimeoutMs * 2, 'connect', signal);
    } catch (e) {
      opening.then((late) => late.close()).catch(() => {}); // opened after all: closed
      throw e;
    }
    this.#waits.add(c);
    return c;
  }

  /** @internal */
  async closeWait(c: Connection): Promise<void> {
    this.#waits.delete(c);
    await c.close().catch(() => {});
  }

  /** @internal `args` on the user's connection, sent again after transient failures (backing
   * off from 20 ms to 1 s) until a reply or `untilMs` (monotonic) passes; then the last error. */
  async resend(args: readonly Arg[], untilMs: number): Promise<unknown> {
    let backoff = 20;
    for (;;) {
      try {
        return await bounded(this.conn.send(args), this.responseTimeoutMs, String(args[0]));
      } catch (e) {
        const t = now();
        if (!isTransient(e) || t >= untilMs) throw e;
        await sleep(Math.min(backoff, untilMs - t));
        backoff = Math.min(backoff * 2, 1000);
      }
    }
  }

  /** @internal Runs `task` in the background (awaited by `close()`). */
  background<T>(task: Promise<T>): Promise<T> {
    const t = task.finally(() => this.#background.delete(t));
    t.catch(() => {});
    this.#background.add(t);
    return task;
  }

  /** @internal `RLOCK.CANCEL key rid`, sent until answered (a lease `leaseMs` long at most plus a
   * response timeout); awaited two response timeouts at most, then left to the background. After
   * its answer, whatever it is, the request holds nothing and never will. */
  async cancel(key: Arg, rid: string, leaseMs: number): Promise<void> {
    const horizon = now() + (leaseMs || REQUEST_RECORD_MS) + this.responseTimeoutMs;
    const task = this.background(this.resend(['RLOCK.CANCEL', key, rid], horizon));
    await bounded(task, 2 * this.responseTimeoutMs, 'RLOCK.CANCEL').catch(() => {});
  }
}

/** One continuous hold of a handle: the first grant, then its re-entries, until the last
 * release. Stored on the server under an owner id of its own with count 1; re-entries are
 * counted here once the server confirmed the hold (`RLOCK.RENEW`). */
class HoldState {
  count = 1;
  lost = false;
  ended = false;
  validUntil: number; // monotonic ms
  readonly controller = new AbortController();
  #renewTimer: NodeJS.Timeout | undefined;
  #endTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly lock: Lock,
    readonly owner: string,
    readonly token: bigint,
    readonly leaseMs: number,
    readonly watchdog: boolean,
    sentAt: number,
  ) {
    this.validUntil = sentAt + leaseMs;
    this.#armEnd();
    if (watchdog) this.#armRenewal(leaseMs / 3);
  }

  #armEnd(): void {
    if (this.#endTimer !== undefined) clearTimeout(this.#endTimer);
    this.#endTimer = setTimeout(() => this.markLost('its lease ended'), Math.max(0, this.validUntil - now()));
    this.#endTimer.unref();
  }

  #armRenewal(delay: number, backoff = 50): void {
    clearTimeout(this.#renewTimer);
    this.#renewTimer = setTimeout(() => void this.#renew(backoff), Math.max(0, delay));
    this.#renewTimer.unref();
  }

  /** The watchdog: `RLOCK.RENEW key owner lease GT` every third of the lease; after a failure
   * sent again backing off from 50 ms (doubling up to the renewal period) until the lease ends;
   * lost when the server says it is not held. */
  async #renew(backoff: number): Promise<void> {
    if (this.ended || this.lost) return;
    const rl = this.lock.rl;
    const sentAt = now();
    try {
      const reply = await bounded(
        rl.conn.send(['RLOCK.RENEW', this.lock.key, this.owner, String(this.leaseMs), 'GT']),
        rl.responseTimeoutMs,
        'RLOCK.RENEW',
      );
      if (this.ended || this.lost) return;
      if (Number(reply) !== 1) return this.markLost('its renewal found it gone');
      this.extend(sentAt + this.leaseMs);
      this.#armRenewal(this.leaseMs / 3);
    } catch {
      if (this.ended || this.lost) return;
      const period = this.leaseMs / 3;
      const delay = Math.min(backoff, period, Math.max(0, this.validUntil - now()));
      this.#armRenewal(delay, Math.min(period, Math.max(50, backoff * 2)));
    }
  }

  /** The server holds it at least until `until` (monotonic ms). */
  extend(until: number): void {
    if (until > this.validUntil) {
      this.validUntil = until;
      this.#armEnd();
    }
  }

  markLost(why: string): void {
    if (this.lost || this.ended) return;
    this.lost = true;
    this.stop();
    this.lock.dropped(this);
    this.controller.abort(new LockLost(`the hold of ${this.lock.label} was lost: ${why}`, this.lock.label));
  }

  stop(): void {
    clearTimeout(this.#renewTimer);
    clearTimeout(this.#endTimer);
  }

  lostError(): LockLost {
    const r: unknown = this.controller.signal.reason;
    return r instanceof LockLost ? r : new LockLost(`the hold of ${this.lock.label} was lost`, this.lock.label);
  }
}

/** One acquire's grant (a first grant or a re-entry): `await using hold = await lock.acquire()`. */
export class Hold implements AsyncDisposable {
  #released = false;
  readonly #state: HoldState;

  /** @internal */
  constructor(state: HoldState) {
    this.#state = state;
  }

  /** The fencing token: greater than every token granted before on this lock name. A re-entry
   * has its first grant's. */
  get token(): bigint {
    return this.#state.token;
  }

  /** The owner id the server holds it under: `<client id>:<handle>:<hold>`. */
  get owner(): string {
    return this.#state.owner;
  }

  /** Until when (epoch ms, from a monotonic clock) the server holds it at least. */
  get validUntil(): number {
    return toEpoch(this.#state.validUntil);
  }

  /** Aborted (its reason a `LockLost`) when the hold is lost: its lease ended, its renewal
   * found it gone or kept failing. */
  get signal(): AbortSignal {
    return this.#state.controller.signal;
  }

  /** Whether it was lost before its release. */
  get lost(): boolean {
    return this.#state.lost;
  }

  /** Whether this grant was released. */
  get released(): boolean {
    return this.#released;
  }

  /** Throws `LockLost` when the hold was lost. */
  check(): void {
    if (this.#state.lost) throw this.#state.lostError();
  }

  /** Gives this grant back (the server's hold at the last one). Idempotent: later calls do
   * nothing. Throws `LockLost` (sending nothing) when the hold was lost before. */
  async release(): Promise<void> {
    if (this.#released) return;
    this.#released = true;
    const s = this.#state;
    s.count -= 1;
    if (s.lost) {
      if (s.count === 0) s.ended = true;
      throw s.lostError();
    }
    if (s.count > 0) return;
    try {
      await s.lock.releaseState(s);
    } catch (e) {
      if (!(e instanceof LockLost)) {
        // refused by the server: still held (the watchdog goes on); the caller may retry
        s.count += 1;
        this.#released = false;
      }
      throw e;
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }
}

/**
 * A reentrant lock handle (`rlock.lock(name)`): RLOCK.* on Redisson's layout. Acquires of one
 * handle take turns: while it holds the lock, an acquire re-enters (counted here).
 */
export class Lock {
  /** @internal */ readonly rl: RLock;
  /** @internal */ readonly key: string | Buffer;
  /** This handle's id (owner ids of its holds are `<id>:<n>`). */
  readonly id: string;
  #holds = 0;
  #state: HoldState | null = null;
  #turn: Promise<void> = Promise.resolve();

  /** @internal */
  constructor(rl: RLock, key: string | Buffer, id: string) {
    this.rl = rl;
    this.key = key;
    this.id = id;
  }

  /** The lock's name as a string. */
  get label(): string {
    return typeof this.key === 'string' ? this.key : this.key.toString('latin1');
  }

  /** Whether this handle holds the lock (a live hold). */
  isHeld(): boolean {
    return this.#state !== null && !this.#state.lost;
  }

  /** Takes the lock, waiting in the server (FIFO) up to `waitMs` (absent: without limit).
   * Throws `LockTimeout` when not taken in time; on abort, rejects with the signal's reason,
   * holding nothing. */
  async acquire(options?: AcquireOptions): Promise<Hold> {
    const hold = await this.#take(options, 'acquire options', undefined);
    if (hold === null) throw new LockTimeout(`${this.label} was not taken within the wait`, this.label);
    return hold;
  }

  /** One try (or a wait of `waitMs`): the hold, or null when not taken. */
  async tryAcquire(options?: AcquireOptions): Promise<Hold | null> {
    return this.#take(options, 'tryAcquire options', 0);
  }

  async #take(options: unknown, what: string, defaultWait: number | undefined): Promise<Hold | null> {
    const o = V.options(options, what);
    V.known(o, ACQUIRE_KEYS, what);
    const waitMs = 'waitMs' in o ? V.ms(o.waitMs, 'waitMs', 0) : defaultWait;
    const leaseMs = V.ms(o.leaseMs, 'leaseMs', 1);
    const signal = V.signal(o.signal);
    if (signal?.aborted) throw abortReason(signal);

    let done!: () => void;
    const mine = new Promise<void>((r) => (done = r));
    const gate = this.#turn;
    this.#turn = gate.then(() => mine);
    try {
      await bounded(gate, Infinity, 'turn', signal);
      const t0 = now();
      const state = this.#state;
      if (state !== null && !state.lost) return await this.#reenter(state, waitMs, leaseMs, signal);
      const fresh = await this.#acquire(t0, waitMs, leaseMs, signal);
      if (fresh === null) return null;
      this.#state = fresh;
      return new Hold(fresh);
    } finally {
      done();
    }
  }

  /** A re-entry: the server confirms this exact hold (`RLOCK.RENEW ... GT`, never shortening
   * it), then it counts one more. */
  async #reenter(s: HoldState, waitMs: number | undefined, leaseMs: number | undefined, signal?: AbortSignal): Promise<Hold> {
    const rl = this.rl;
    const remaining = Math.max(0, Math.ceil(s.validUntil - now()));
    const lease = Math.max(leaseMs ?? rl.watchdogMs, s.watchdog ? s.leaseMs : remaining, 1);
    const until = now() + (waitMs ? waitMs : rl.responseTimeoutMs);
    const sentAt = now();
    const reply = await bounded(rl.resend(['RLOCK.RENEW', this.key, s.owner, String(lease), 'GT'], until), Infinity, 'RLOCK.RENEW', signal);
    if (Number(reply) !== 1) s.markLost('a re-entry found it gone');
    if (s.lost) throw s.lostError();
    s.extend(sentAt + lease);
    s.count += 1;
    return new Hold(s);
  }

  /** A fresh acquire: `RLOCK.ACQUIRE key owner lease TOKEN REQUEST id [WAIT ms]`, the wait on a
   * dedicated connection. Whenever it ends without handing a grant over while its request may
   * be queued or granted (an abort, no reply in time, a failed connection), `RLOCK.CANCEL key
   * id` gives back exactly what it got. */
  async #acquire(t0: number, waitMs: number | undefined, leaseMs: number | undefined, signal?: AbortSignal): Promise<HoldState | null> {
    const rl = this.rl;
    const lease = leaseMs ?? rl.watchdogMs;
    const owner = `${this.id}:${++this.#holds}`;
    const end = waitMs === undefined ? Infinity : t0 + waitMs;
    // one try: transient failures tried again for one response timeout
    const retryEnd = waitMs === 0 ? t0 + rl.responseTimeoutMs : end;
    let rid = newId();
    let needCancel = false;
    let backoff = 20;
    let conn: Connection | null = null;
    try {
      for (;;) {
        if (signal?.aborted) throw abortReason(signal);
        const t = now();
        let wait: number | null;
        if (waitMs === 0) wait = null;
        else if (end === Infinity) wait = 0;
        else wait = end > t ? Math.max(1, Math.ceil(end - t)) : null;
        const args: Arg[] = ['RLOCK.ACQUIRE', this.key, owner, String(lease), 'TOKEN', 'REQUEST', rid];
        if (wait !== null) args.push('WAIT', String(wait));
        let reply: unknown;
        const sentAt = now();
        try {
          if (wait === null) {
            needCancel = true;
            reply = await bounded(rl.conn.send(args), rl.responseTimeoutMs, 'RLOCK.ACQUIRE', signal);
          } else {
            conn ??= await rl.openWait(signal);
            needCancel = true;
            const within = wait === 0 ? Infinity : wait + rl.responseTimeoutMs;
            reply = await bounded(conn.send(args), within, 'RLOCK.ACQUIRE', signal);
          }
        } catch (e) {
          if (signal?.aborted && e === abortReason(signal)) throw e;
          if (isCancelledReply(e)) {
            // the request holds nothing and never will: asked again, a new request
            needCancel = false;
            if (waitMs !== 0 && now() < end) {
              rid = newId();
              continue;
            }
            return null;
          }
          if (e instanceof ServerError && !transientReply(e)) {
            if (/^NOREPLICAS\b/.test(e.message) && waitMs !== 0 && now() + Math.min(backoff, 50) < end) {
              await sleep(Math.min(backoff, end - now()), signal);
              backoff = Math.min(backoff * 2, 1000);
              continue;
            }
            needCancel = false; // an error reply changed nothing
            throw fromReply(e.message, this.label);
          }
          // no reply in time, or a failed connection: the request may be queued or granted
          if (conn !== null) {
            await rl.closeWait(conn);
            conn = null;
          }
          if (e instanceof Stalled && wait !== null) return null; // the wait's time is up: cancelled below
          const t2 = now();
          if (t2 >= retryEnd) {
            if (waitMs === 0) throw e;
            return null;
          }
          await sleep(Math.min(backoff, retryEnd - t2), signal);
          backoff = Math.min(backoff * 2, 1000);
          continue;
        }
        const [granted, value] = reply as [unknown, unknown];
        if (Number(granted) === 1) {
          // an abort that landed with the grant: given back by the cancel
          if (signal?.aborted) throw abortReason(signal);
          needCancel = false;
          return new HoldState(this, owner, BigInt(value as number), lease, leaseMs === undefined, sentAt);
        }
        needCancel = false; // not granted: nothing held
        if (wait !== null && Number(value) === 0 && now() < end) continue; // free, not grantable then
        return null;
      }
    } finally {
      if (needCancel) await rl.cancel(this.key, rid, lease);
      if (conn !== null) await rl.closeWait(conn);
    }
  }

  /** @internal The last release of a hold: `RLOCK.RELEASE key owner REQUEST id`, sent again
   * after transient failures (within its lease, three response timeouts at most, then in the
   * background up to 6 s from the first send). */
  async releaseState(s: HoldState): Promise<void> {
    const rl = this.rl;
    const args: Arg[] = ['RLOCK.RELEASE', this.key, s.owner, 'REQUEST', newId()];
    const first = now();
    const until = Math.min(s.validUntil, first + 3 * rl.responseTimeoutMs);
    let reply: unknown;
    try {
      reply = await rl.resend(args, until);
    } catch (e) {
      if (e instanceof ServerError && !transientReply(e)) throw fromReply(e.message, this.label);
      // sent on in the background; the hold is over for the caller
      s.ended = true;
      s.stop();
      this.dropped(s);
      rl.background(rl.resend(args, Math.min(s.validUntil, first + RELEASE_RESEND_MS))).catch(() => {});
      return;
    }
    if (reply === null || reply === undefined) {
      s.markLost('the release found it gone');
      s.ended = true;
      throw s.lostError();
    }
    s.ended = true;
    s.stop();
    this.dropped(s);
  }

  /** @internal `s` is no longer this handle's hold. */
  dropped(s: HoldState): void {
    if (this.#state === s) this.#state = null;
  }
}

/**
 * Runs `fn` holding the lock `name`: `withLock(client, 'orders:42', { waitMs: 5000 }, async
 * (signal, token) => ...)`. `client` is an RLock or a node-redis / ioredis client (its RLock made
 * at first use). `signal` aborts when the hold is lost. Released when `fn` settles.
 */
export async function withLock<T>(
  client: unknown,
  name: string | Buffer,
  options: AcquireOptions | undefined,
  fn: (signal: AbortSignal, token: bigint) => Promise<T> | T,
): Promise<T> {
  if (typeof fn !== 'function') throw new InvalidArgument('withLock needs a function');
  const lock = RLock.of(client).lock(name);
  await using hold = await lock.acquire(options);
  return await fn(hold.signal, hold.token);
}
