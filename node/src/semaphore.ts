import { acquireOnce, type AcquireSpec } from './acquiring.js';
import { ServerError, type Arg } from './adapter.js';
import { fromReply, LockTimeout } from './errors.js';
import { grantStart, Lease, Leased } from './lease.js';
import type { RLock } from './lock.js';
import { abortReason, newId, now, REQUEST_RECORD_MS } from './util.js';
import * as V from './validate.js';

/** How long after its first send a counted release is sent again: while the server surely
 * still remembers it (60 s), 10 s of margin. */
const COUNTED_RESEND_MS = REQUEST_RECORD_MS - 10000;
/** Most permits one leased acquire may ask for (the module refuses more). */
export const MAX_LEASED_PERMITS = 10000;

export interface PermitOptions {
  /** How many permits (default 1). */
  permits?: number;
  /** How long to wait in the server: absent waits without limit, 0 is one try. */
  waitMs?: number;
  /** Aborts the acquire: it then holds nothing (its request is cancelled in the server). */
  signal?: AbortSignal;
}

export interface LeasedPermitOptions extends PermitOptions {
  /** The permits' lease; absent: the watchdog's lease, renewed until release. */
  leaseMs?: number;
}

abstract class SemaphoreBase {
  /** @internal */ readonly rl: RLock;
  /** @internal */ readonly key: string | Buffer;

  /** @internal */
  constructor(rl: RLock, key: string | Buffer) {
    this.rl = rl;
    this.key = key;
  }

  /** The semaphore's name as a string. */
  get label(): string {
    return typeof this.key === 'string' ? this.key : this.key.toString('latin1');
  }

  /** @internal */
  async call(args: readonly Arg[]): Promise<unknown> {
    try {
      return await this.rl.resend(args, now() + this.rl.responseTimeoutMs);
    } catch (e) {
      throw e instanceof ServerError ? fromReply(e.message, this.label) : e;
    }
  }

  /** Sets the permits if the semaphore does not exist yet: true when set. */
  async trySetPermits(permits: number): Promise<boolean> {
    const n = V.int(permits, 'permits', 0, Number.MAX_SAFE_INTEGER);
    return Number(await this.call(['RSEM.SETPERMITS', this.key, String(n)])) === 1;
  }

  /** Adds (negative: takes away) permits; the count after it (and after the waiters served).
   * Not idempotent: not sent again after a lost reply. */
  async addPermits(delta: number): Promise<number> {
    const d = V.int(delta, 'delta', -Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
    try {
      return Number(await this.rl.conn.send(['RSEM.ADDPERMITS', this.key, String(d)]));
    } catch (e) {
      throw e instanceof ServerError ? fromReply(e.message, this.label) : e;
    }
  }

  /** The permits available now (0 when the semaphore does not exist). */
  async available(): Promise<number> {
    return Number(await this.call(['RSEM.AVAILABLE', this.key]));
  }

  /** @internal */
  parse(options: unknown, what: string, leased: boolean, defaultWait: number | undefined) {
    const o = V.options(options, what);
    V.known(o, leased ? ['permits', 'waitMs', 'leaseMs', 'signal'] : ['permits', 'waitMs', 'signal'], what);
    const permits = V.int(o.permits, 'permits', 1, leased ? MAX_LEASED_PERMITS : Number.MAX_SAFE_INTEGER, 1);
    const waitMs = o.waitMs !== undefined ? V.ms(o.waitMs, 'waitMs', 0) : defaultWait; // undefined: the default, as a default parameter
    const leaseMs = V.ms(o.leaseMs, 'leaseMs', 1);
    const signal = V.signal(o.signal);
    if (signal?.aborted) throw abortReason(signal);
    return { permits, waitMs, leaseMs, signal };
  }
}

/**
 * Counted permits (`rlock.semaphore(name)`, Redisson's `RSemaphore`): nothing records who holds
 * them. An acquire waits in the server (FIFO) and is cancelled exactly as a lock's; its
 * `Permits` give back exactly what it got (`RSEM.RELEASE key n REQUEST id`, idempotent).
 */
export class Semaphore extends SemaphoreBase {
  /** Takes `permits` (default 1), waiting up to `waitMs` (absent: without limit); `LockTimeout`
   * when not taken in time. */
  async acquire(options?: PermitOptions): Promise<Permits> {
    const got = await this.#take(options, 'acquire options', undefined);
    if (got === null) throw new LockTimeout(`${this.label}: permits not taken within the wait`, this.label);
    return got;
  }

  /** One try (or a wait of `waitMs`): the permits, or null. */
  async tryAcquire(options?: PermitOptions): Promise<Permits | null> {
    return this.#take(options, 'tryAcquire options', 0);
  }

  async #take(options: unknown, what: string, defaultWait: number | undefined): Promise<Permits | null> {
    const { permits, waitMs, signal } = this.parse(options, what, false, defaultWait);
    const spec: AcquireSpec<true> = {
      key: this.key,
      label: this.label,
      leaseMs: 0,
      args: (rid, wait) => {
        const args: Arg[] = ['RSEM.ACQUIRE', this.key, String(permits)];
        if (wait !== null) args.push('WAIT', String(wait));
        args.push('REQUEST', rid);
        return args;
      },
      read: (reply) => (Number(reply) === 1 ? { grant: true } : { again: false }),
    };
    const got = await acquireOnce(this.rl, spec, waitMs, signal);
    return got === null ? null : new Permits(this, permits, got.rid);
  }

  /** Gives `permits` back, whoever took them (as Redisson's `release(n)`), once (`ONCE id`: sent
   * again after a lost reply, never given twice); the count left. */
  async release(permits = 1): Promise<number> {
    const n = V.int(permits, 'permits', 1, Number.MAX_SAFE_INTEGER);
    const args: Arg[] = ['RSEM.RELEASE', this.key, String(n), 'ONCE', newId()];
    const first = now();
    return Number(await this.rl.giveBack(args, this.label, first + 3 * this.rl.responseTimeoutMs, first + COUNTED_RESEND_MS));
  }
}

/** Counted permits one acquire got: `await using p = await sem.acquire({ permits: 2 })`. */
export class Permits implements AsyncDisposable {
  #released = false;
  #releasing: Promise<void> | null = null;

  /** @internal */
  constructor(
    private readonly sem: Semaphore,
    /** How many. */
    readonly permits: number,
    private readonly rid: string,
  ) {}

  get released(): boolean {
    return this.#released;
  }

  /** Gives exactly these permits back (`RSEM.RELEASE key n REQUEST id`); idempotent. */
  release(): Promise<void> {
    if (this.#releasing !== null) return this.#releasing; // one in flight: its outcome
    if (this.#released) return Promise.resolve();
    const p = this.#release().finally(() => (this.#releasing = null));
    this.#releasing = p;
    return p;
  }

  async #release(): Promise<void> {
    this.#released = true;
    const rl = this.sem.rl;
    const args: Arg[] = ['RSEM.RELEASE', this.sem.key, String(this.permits), 'REQUEST', this.rid];
    const first = now();
    try {
      await rl.giveBack(args, this.sem.label, first + 3 * rl.responseTimeoutMs, first + COUNTED_RESEND_MS);
    } catch (e) {
      this.#released = false; // refused: nothing given back
      throw e;
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }
}

/**
 * Leased permits (`rlock.leasedSemaphore(name)`, Redisson's `RPermitExpirableSemaphore`): each
 * permit an id with a lease; taken without a lease, the watchdog renews them.
 */
export class LeasedSemaphore extends SemaphoreBase {
  /** Takes `permits` (default 1), waiting up to `waitMs` (absent: without limit); `LockTimeout`
   * when not taken in time. */
  async acquire(options?: LeasedPermitOptions): Promise<LeasedPermits> {
    const got = await this.#take(options, 'acquire options', undefined);
    if (got === null) throw new LockTimeout(`${this.label}: permits not taken within the wait`, this.label);
    return got;
  }

  /** One try (or a wait of `waitMs`): the permits, or null. */
  async tryAcquire(options?: LeasedPermitOptions): Promise<LeasedPermits | null> {
    return this.#take(options, 'tryAcquire options', 0);
  }

  async #take(options: unknown, what: string, defaultWait: number | undefined): Promise<LeasedPermits | null> {
    const { permits, waitMs, leaseMs, signal } = this.parse(options, what, true, defaultWait);
    const rl = this.rl;
    const lease = leaseMs ?? rl.watchdogMs;
    const spec: AcquireSpec<Buffer[]> = {
      key: this.key,
      label: this.label,
      leaseMs: lease,
      send: { buffers: true },
      args: (rid, wait) => {
        const args: Arg[] = ['RSEM.ACQUIRE', this.key, String(permits), 'LEASE', String(lease)];
        if (wait !== null) args.push('WAIT', String(wait));
        args.push('REQUEST', rid);
        return args;
      },
      read: (reply) => (Array.isArray(reply) ? { grant: reply.map((id) => Buffer.from(id as Buffer)) } : { again: false }),
    };
    const got = await acquireOnce(rl, spec, waitMs, signal);
    if (got === null) return null;
    const renew = renewer(this, got.grant, lease);
    let start: number | null;
    try {
      start = await grantStart(got.sentAt, lease, renew, rl.responseTimeoutMs, signal);
    } catch (e) {
      await rl.cancel(this.key, got.rid, lease); // aborted while confirming: given back
      throw e;
    }
    if (start === null) {
      await rl.cancel(this.key, got.rid, lease); // not confirmed (gone, or no answer): given back
      return null;
    }
    return new LeasedPermits(this, got.grant, lease, leaseMs === undefined, start, renew);
  }
}

/** Renews every one of `ids` for `leaseMs`: true when all were still leased. */
function renewer(sem: LeasedSemaphore, ids: readonly Buffer[], leaseMs: number): () => Promise<boolean> {
  const rl = sem.rl;
  return async () => {
    const replies = await Promise.all(ids.map((id) => rl.conn.send(['RSEM.RENEW', sem.key, id, String(leaseMs)])));
    return replies.every((r) => Number(r) === 1);
  };
}

/** Leased permits one acquire got: their `ids`, a lease, a `signal` aborted when lost. */
export class LeasedPermits extends Leased {
  /** @internal */
  constructor(
    private readonly sem: LeasedSemaphore,
    /** The permits' ids (16 bytes each). */
    readonly ids: readonly Buffer[],
    leaseMs: number,
    watchdog: boolean,
    sentAt: number,
    renew: () => Promise<boolean>,
  ) {
    super(new Lease({ label: sem.label, dropped: () => {} }, leaseMs, watchdog, sentAt, renew, sem.rl.responseTimeoutMs));
  }

  /** How many. */
  get permits(): number {
    return this.ids.length;
  }

  /** @internal Gives the permits back (`RSEM.RELEASE key ID ...`). Throws `LockLost` when they
   * were lost before (sending nothing) or the release found them gone. */
  protected async releaseOnce(): Promise<void> {
    this.setReleased(true);
    const s = this.lease;
    if (s.lost) throw s.lostError();
    const rl = this.sem.rl;
    const first = now();
    let reply: unknown;
    try {
      reply = await rl.giveBack(['RSEM.RELEASE', this.sem.key, 'ID', ...this.ids], this.sem.label, Math.min(s.validUntil, first + 3 * rl.responseTimeoutMs), s.validUntil);
    } catch (e) {
      this.setReleased(false);
      throw e;
    }
    if (reply !== undefined && Number(reply) !== this.ids.length) {
      s.markLost('the release found them gone');
      s.end();
      throw s.lostError();
    }
    s.end();
  }
}

