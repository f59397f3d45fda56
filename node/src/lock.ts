import { randomUUID } from 'node:crypto';
import type { Engine } from './acquiring.js';
import { adapt, ServerError, type Arg, type Connection, type SendOptions } from './adapter.js';
import { fromReply, InvalidArgument, LockLost, RLockClosed } from './errors.js';
import { Lease, Leased } from './lease.js';
import { WaitPool } from './pool.js';
import { abortReason, bounded, isTransient, now, REQUEST_RECORD_MS, sleep, transientReply } from './util.js';
import * as V from './validate.js';
import { LeasedSemaphore, Semaphore } from './semaphore.js';
import { Owner, RWLock } from './rw.js';
import { Session, type SessionOptions } from './session.js';
import { CountDownLatch } from './latch.js';
import { Side } from './side.js';

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

/**
 * The client: one per node-redis or ioredis client (`new RLock(client)`), the user's own client
 * for short commands, and a dedicated duplicate of it for each wait in the server.
 */
export class RLock implements Engine {
  /** This client's id, the first part of every owner id (`<id>:<handle>:<hold>`). */
  readonly id: string = randomUUID();
  /** @internal */ readonly conn: Connection;
  /** @internal */ readonly responseTimeoutMs: number;
  /** @internal */ readonly watchdogMs: number;
  #handles = 0;
  readonly #background = new Set<Promise<unknown>>();
  readonly #waits = new Set<Connection>();
  readonly #pool = new WaitPool();
  #closes = 0;
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

  /** A read-write lock handle named `name` (`.read`, `.write`): one owner for both sides. */
  rwLock(name: string | Buffer): RWLock {
    return new RWLock(this, V.name(name), `${this.id}:${++this.#handles}`);
  }

  /** One owner id for a unit of work: its locks re-enter each other's holds, and the server
   * refuses a wait that would close a cycle of owners (`Deadlock`). */
  owner(): Owner {
    return new Owner(this, `${this.id}:${++this.#handles}`);
  }

  /** A session: a dedicated connection of its own whose holds are bound to it (`SESSION`):
   * closing the session, or its connection dying, ends them on the server at once. */
  async session(options?: SessionOptions): Promise<Session> {
    return Session.open(this, `${this.id}:${++this.#handles}`, options);
  }

  /** A count-down latch (Redisson's `RCountDownLatch`) named `name`. */
  latch(name: string | Buffer): CountDownLatch {
    return new CountDownLatch(this, V.name(name));
  }

  /** A semaphore of counted permits (Redisson's `RSemaphore`) named `name`. */
  semaphore(name: string | Buffer): Semaphore {
    return new Semaphore(this, V.name(name));
  }

  /** A semaphore of leased permits (Redisson's `RPermitExpirableSemaphore`) named `name`. */
  leasedSemaphore(name: string | Buffer): LeasedSemaphore {
    return new LeasedSemaphore(this, V.name(name));
  }

  /** Waits (at most `timeoutMs`) for cancels and releases still being sent in the background,
   * and closes the connections of waits still open: those acquires (and latch waits) reject
   * with `RLockClosed`, holding nothing (never asked again on a new connection). The user's
   * client stays open, and acquires begun later work as before. */
  async close(timeoutMs = 5000): Promise<void> {
    timeoutMs = V.ms(timeoutMs, 'timeoutMs', 0) ?? 5000;
    // a wait still on ends when its connection closes below (its acquire is never asked again
    // on a new one); acquires begun after this close work as before
    this.#closes++;
    const all = Promise.allSettled([...this.#background]);
    await bounded(all, timeoutMs, 'close').catch(() => {});
    await Promise.allSettled([...this.#waits].map((c) => c.close()));
    this.#waits.clear();
    await this.#pool.close();
    await this.conn.dispose?.().catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** @internal The database the client is in now (a run-time SELECT), within a response
   * timeout; undefined when unknown. An abort rejects with the signal's reason. */
  async database(signal?: AbortSignal): Promise<number | undefined> {
    return bounded(this.conn.database?.() ?? Promise.resolve(undefined), this.responseTimeoutMs, 'CLIENT INFO', signal).catch((e: unknown) => {
      if (signal?.aborted && e === abortReason(signal)) throw e;
      return undefined;
    });
  }

  /** @internal A dedicated connection for one wait on `key` (in a cluster: to its node): one
   * kept from an earlier wait that ended cleanly, else a new one. */
  async openWait(signal?: AbortSignal, key?: Arg, options?: SendOptions): Promise<Connection> {
    // the database the client is in now (a run-time SELECT): the wait runs there, and is kept
    // for waits in that database only
    const db = await this.database(signal);
    const base = this.conn.poolKey?.(key, options);
    const poolKey = base === undefined ? undefined : `${base}:db${db ?? ''}`;
    let c = this.#pool.take(poolKey);
    if (c === null) {
      const opening = (async () => {
        const d = await this.conn.duplicate(key, options);
        if (db !== undefined) {
          try {
            await d.send(['SELECT', String(db)]);
          } catch (e) {
            await d.close().catch(() => {});
            throw e;
          }
        }
        return d;
      })();
      try {
        c = await bounded(opening, this.responseTimeoutMs * 2, 'connect', signal);
      } catch (e) {
        opening.then((late) => late.close()).catch(() => {}); // opened after all: closed
        throw e;
      }
      this.#pool.opened(c, poolKey);
    }
    this.#waits.add(c);
    return c;
  }

  /** @internal Closes a wait's connection (ending its wait in the server, if still on); with
   * `flush` (the connection failed, or a failover answered), the idle ones of the same server
   * or slot too. */
  async closeWait(c: Connection, flush = false): Promise<void> {
    this.#waits.delete(c);
    await this.#pool.discard(c, flush);
  }

  /** @internal A wait's connection whose last reply was read (nothing pending on it): kept for
   * the next wait. */
  async doneWait(c: Connection): Promise<void> {
    this.#waits.delete(c);
    await this.#pool.giveBack(c);
  }

  /** @internal How many times `close()` was called: an acquire or latch wait begun before a
   * close ends with `RLockClosed` instead of opening a wait connection after it. */
  get closes(): number {
    return this.#closes;
  }

  /** @internal Throws `RLockClosed` when `close()` was called since `closes` was `mark`. */
  checkOpen(mark: number): void {
    if (this.#closes !== mark) throw new RLockClosed('the RLock was closed during this wait');
  }

  /** @internal Idle wait connections kept now. */
  get idleWaits(): number {
    return this.#pool.size;
  }

  /** @internal `args` on the user's connection, sent again after transient failures (backing
   * off from 20 ms to 1 s) until a reply or `untilMs` (monotonic) passes; then the last error. */
  async resend(args: readonly Arg[], untilMs: number, signal?: AbortSignal): Promise<unknown> {
    let backoff = 20;
    for (;;) {
      try {
        return await bounded(this.conn.send(args), this.responseTimeoutMs, String(args[0]), signal);
      } catch (e) {
        if (signal?.aborted && e === abortReason(signal)) throw e;
        const t = now();
        if (!isTransient(e) || t >= untilMs || this.conn.closed?.() === true) throw e;
        await sleep(Math.min(backoff, untilMs - t), signal);
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

  /** @internal `RLOCK.CANCEL key rid`, sent until answered (a lease `leaseMs` long at most, or
   * while the server remembers the request, plus a response timeout); awaited two response
   * timeouts at most, then left to the background. After its answer, whatever it is, the
   * request holds nothing and never will. */
  async cancel(key: Arg, rid: string, leaseMs: number): Promise<void> {
    const horizon = now() + (leaseMs || REQUEST_RECORD_MS) + this.responseTimeoutMs;
    const task = this.background(this.resend(['RLOCK.CANCEL', key, rid], horizon));
    await bounded(task, 2 * this.responseTimeoutMs, 'RLOCK.CANCEL').catch(() => {});
  }

  /** @internal A give-back (`args`, idempotent by its id) sent within `untilMs`; when that
   * passes without an answer, sent on in the background until `backgroundUntilMs`; undefined
   * then. An error reply is thrown as the package's error. */
  async giveBack(args: readonly Arg[], label: string, untilMs: number, backgroundUntilMs: number): Promise<unknown> {
    try {
      return await this.resend(args, untilMs);
    } catch (e) {
      if (e instanceof ServerError && !transientReply(e)) throw fromReply(e.message, label);
      this.background(this.resend(args, backgroundUntilMs)).catch(() => {});
      return undefined;
    }
  }
}

/** What gives a hold's last grant back (a lock handle, a side of a read-write lock). */
export interface Releaser {
  releaseLease(s: Lease, owner: string): Promise<void>;
}

/** One acquire's grant (a first grant or a re-entry): `await using hold = await lock.acquire()`. */
export class Hold extends Leased {
  readonly #lock: Releaser;
  readonly #owner: string;
  readonly #token: bigint;

  /** @internal */
  constructor(lock: Releaser, lease: Lease, owner: string, token: bigint) {
    super(lease);
    this.#lock = lock;
    this.#owner = owner;
    this.#token = token;
  }

  /** The fencing token: greater than every token granted before on this lock name. A re-entry
   * has its first grant's. */
  get token(): bigint {
    return this.#token;
  }

  /** The owner id the server holds it under: `<client id>:<handle>:<hold>`. */
  get owner(): string {
    return this.#owner;
  }

  /** @internal Gives this grant back (the server's hold at the last one). Throws `LockLost`
   * (sending nothing) when the hold was lost before. */
  protected async releaseOnce(): Promise<void> {
    this.setReleased(true);
    const s = this.lease;
    s.count -= 1;
    if (s.lost) throw s.lostError();
    if (s.count > 0) return;
    try {
      await this.#lock.releaseLease(s, this.#owner);
    } catch (e) {
      if (!(e instanceof LockLost)) {
        // refused by the server: still held (the watchdog goes on); the caller may retry
        s.count += 1;
        this.setReleased(false);
      }
      throw e;
    }
  }
}

/** Acquires of one handle (or semaphore) take turns: `run` after the ones before it. */
export class Turns {
  #turn: Promise<void> = Promise.resolve();
  /** Turns begun and not finished (running or waiting). */
  #pending = 0;

  async run<T>(signal: AbortSignal | undefined, fn: () => Promise<T>): Promise<T> {
    let done!: () => void;
    const mine = new Promise<void>((r) => (done = r));
    const gate = this.#turn;
    this.#turn = gate.then(() => mine);
    const free = this.#pending === 0; // nobody before it: no need to wait for the gate
    this.#pending++;
    try {
      if (!free) await bounded(gate, Infinity, 'turn', signal);
      return await fn();
    } finally {
      this.#pending--;
      done();
    }
  }
}

/**
 * A reentrant lock handle (`rlock.lock(name)`): RLOCK.* on Redisson's layout. Acquires of one
 * handle take turns: while it holds the lock, an acquire re-enters (counted here). A `Side` of
 * mode `LOCK` whose every continuous hold takes an owner id of its own (`<handle id>:<n>`).
 */
export class Lock {
  /** @internal */ readonly rl: RLock;
  /** @internal */ readonly key: string | Buffer;
  /** This handle's id (owner ids of its holds are `<id>:<n>`). */
  readonly id: string;
  readonly #side: Side;

  /** @internal */
  constructor(rl: RLock, key: string | Buffer, id: string) {
    this.rl = rl;
    this.key = key;
    this.id = id;
    let holds = 0;
    this.#side = new Side(rl, key, 'LOCK', new Turns(), { ownerFor: () => `${id}:${++holds}`, fixedOwner: false });
  }

  /** The lock's name as a string. */
  get label(): string {
    return this.#side.label;
  }

  /** Whether this handle holds the lock (a live hold). */
  isHeld(): boolean {
    return this.#side.isHeld();
  }

  /** Takes the lock, waiting in the server (FIFO) up to `waitMs` (absent: without limit).
   * Throws `LockTimeout` when not taken in time; on abort, rejects with the signal's reason,
   * holding nothing. */
  async acquire(options?: AcquireOptions): Promise<Hold> {
    return this.#side.acquire(options);
  }

  /** One try (or a wait of `waitMs`): the hold, or null when not taken. */
  async tryAcquire(options?: AcquireOptions): Promise<Hold | null> {
    return this.#side.tryAcquire(options);
  }

  /** @internal The last release of a hold: `RLOCK.RELEASE key owner REQUEST id`, sent again
   * after transient failures (within its lease, three response timeouts at most, then in the
   * background up to 6 s from the first send). */
  async releaseLease(s: Lease, owner: string): Promise<void> {
    return this.#side.releaseLease(s, owner);
  }

  /** @internal `s` is no longer this handle's hold. */
  dropped(s: Lease): void {
    this.#side.dropped(s);
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
