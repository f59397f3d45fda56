import { acquireOnce, type AcquireSpec, type Engine } from './acquiring.js';
import { ServerError, type Arg, type Connection } from './adapter.js';
import { fromReply, LockLost, LockTimeout, RLockError } from './errors.js';
import { grantStart, Lease } from './lease.js';
import { Hold, type AcquireOptions, type RLock, type Turns } from './lock.js';
import { abortReason, bounded, newId, now, RELEASE_RESEND_MS, REQUEST_RECORD_MS, Stalled, transientReply } from './util.js';
import * as V from './validate.js';

/** What a side takes: a reentrant lock (`RLOCK.*`) or one side of a read-write lock (`RWLOCK.*`). */
export type Mode = 'LOCK' | 'READ' | 'WRITE';

const ACQUIRE_KEYS = ['waitMs', 'leaseMs', 'signal'] as const;

export interface SideOptions {
  /** The owner id of a fresh grant (the server's count going from 0 to 1). */
  ownerFor(): string;
  /** Owner ids are reused from hold to hold (an `Owner`'s): a fresh grant first waits for this
   * side's give-backs and renewals still in flight, and drops a stale count it re-entered. */
  fixedOwner: boolean;
  /** Words added to every acquire (`SESSION`, `LOCKDELAY ms`). */
  extra?: readonly Arg[];
  /** The acquire engine (default: the RLock's). */
  engine?: Engine;
  /** Runs a fresh acquire (a session's: one at a time on its connection). */
  exclusive?<T>(signal: AbortSignal | undefined, fn: () => Promise<T>): Promise<T>;
  /** Before a fresh acquire, in the turn: may throw (an upgrade a one-try would never get). */
  beforeFresh?(waitMs: number | undefined): void;
  /** A fresh grant's lease (a session records it), and how to give its hold back from the
   * client's own connection (a session whose connection ended: see `Session`). */
  adopt?(lease: Lease, giveBack: () => void): void;
}

interface Current {
  lease: Lease;
  owner: string;
  token: bigint;
}

/**
 * One side a caller holds: a lock handle's state (the current hold, counted re-entries) for a
 * reentrant lock or one side of a read-write lock, with the same decisions as `Lock`: a
 * re-entry is confirmed by the server (`RENEW ... GT`) and counted here, so the server keeps
 * count 1 under the hold's owner id; the last release sends `RELEASE ... REQUEST id`.
 */
export class Side {
  #current: Current | null = null;
  readonly #pending = new Set<Promise<unknown>>();

  /** @internal */
  constructor(
    /** @internal */ readonly rl: RLock,
    /** The lock's name. */ readonly key: string | Buffer,
    /** `LOCK`, `READ` or `WRITE`. */ readonly mode: Mode,
    /** @internal */ readonly turns: Turns,
    /** @internal */ readonly opts: SideOptions,
  ) {}

  get label(): string {
    return typeof this.key === 'string' ? this.key : this.key.toString('latin1');
  }

  /** The live hold's owner id, or null. */
  heldBy(): string | null {
    const c = this.#current;
    return c !== null && !c.lease.lost ? c.owner : null;
  }

  isHeld(): boolean {
    return this.heldBy() !== null;
  }

  async acquire(options?: AcquireOptions): Promise<Hold> {
    const hold = await this.take(options, 'acquire options', undefined);
    if (hold === null) throw new LockTimeout(`${this.label} was not taken within the wait`, this.label);
    return hold;
  }

  async tryAcquire(options?: AcquireOptions): Promise<Hold | null> {
    return this.take(options, 'tryAcquire options', 0);
  }

  /** @internal */
  async take(options: unknown, what: string, defaultWait: number | undefined): Promise<Hold | null> {
    const o = V.options(options, what);
    V.known(o, ACQUIRE_KEYS, what);
    const waitMs = o.waitMs !== undefined ? V.ms(o.waitMs, 'waitMs', 0) : defaultWait; // undefined: the default, as a default parameter
    const leaseMs = V.ms(o.leaseMs, 'leaseMs', 1);
    const signal = V.signal(o.signal);
    if (signal?.aborted) throw abortReason(signal);
    return this.turns.run(signal, async () => {
      const cur = this.#current;
      if (cur !== null && !cur.lease.lost) return this.#reenter(cur, waitMs, leaseMs, signal);
      this.opts.beforeFresh?.(waitMs);
      const left = await this.#settled(now(), waitMs, signal);
      if (left === null) return null;
      return this.#fresh(left, leaseMs, signal);
    });
  }

  /** For an owner id reused from hold to hold: waits for the give-backs (release, cancel) and
   * renewals of its earlier hold of this name still in flight, which would otherwise act on the
   * hold taken now; within the acquire's wait (a one-try: a response timeout). The wait left
   * (from `start`), or null when they were still in flight at its end (not taken). */
  async #settled(start: number, waitMs: number | undefined, signal?: AbortSignal): Promise<number | undefined | null> {
    const end = waitMs === undefined ? Infinity : start + Math.max(waitMs, this.rl.responseTimeoutMs);
    while (this.opts.fixedOwner && this.#pending.size > 0) {
      try {
        await bounded(Promise.allSettled([...this.#pending]), end === Infinity ? Infinity : Math.max(0, end - now()), 'a give-back', signal);
      } catch (e) {
        if (e instanceof Stalled) return null;
        throw e;
      }
    }
    return waitMs === undefined ? undefined : Math.max(0, Math.ceil(start + waitMs - now()));
  }

  #track<T>(p: Promise<T>): Promise<T> {
    const t = p.finally(() => this.#pending.delete(t));
    t.catch(() => {});
    this.#pending.add(t);
    return p;
  }

  #renewArgs(owner: string, lease: number): Arg[] {
    if (this.mode === 'LOCK') return ['RLOCK.RENEW', this.key, owner, String(lease), 'GT'];
    return ['RWLOCK.RENEW', this.key, owner, String(lease), this.mode, 'GT'];
  }

  async #reenter(cur: Current, waitMs: number | undefined, leaseMs: number | undefined, signal?: AbortSignal): Promise<Hold | null> {
    const rl = this.rl;
    const s = cur.lease;
    const remaining = Math.max(0, Math.ceil(s.validUntil - now()));
    const lease = Math.max(leaseMs ?? rl.watchdogMs, s.watchdog ? s.leaseMs : remaining, 1);
    const sentAt = now();
    const until = sentAt + (waitMs ? waitMs : rl.responseTimeoutMs);
    let reply: unknown;
    try {
      reply = await rl.resend(this.#renewArgs(cur.owner, lease), until, signal);
    } catch (e) {
      if (signal?.aborted && e === abortReason(signal)) throw e;
      if (e instanceof ServerError && !transientReply(e)) throw fromReply(e.message, this.label);
      if (waitMs !== undefined) return null;
      throw e;
    }
    if (this.#current?.lease !== s && !s.lost) {
      // its last grant was released meanwhile (by another caller): nothing to re-enter, a fresh
      // acquire with the time left (an owner's waits for that release first)
      const left = await this.#settled(sentAt, waitMs, signal);
      if (left === null) return null;
      return this.#fresh(left, leaseMs, signal);
    }
    if (Number(reply) !== 1) s.markLost('a re-entry found it gone');
    if (s.lost) throw s.lostError();
    s.extend(sentAt + lease);
    s.count += 1;
    return new Hold(this, s, cur.owner, cur.token);
  }

  async #fresh(waitMs: number | undefined, leaseMs: number | undefined, signal?: AbortSignal): Promise<Hold | null> {
    const rl = this.rl;
    const lease = leaseMs ?? rl.watchdogMs;
    const owner = this.opts.ownerFor();
    const mode = this.mode;
    const key = this.key;
    const extra = this.opts.extra ?? [];
    const spec: AcquireSpec<bigint> = {
      key,
      label: this.label,
      leaseMs: lease,
      send: { exactNumbers: true }, // a token may pass 2^53
      args: (rid, wait) => {
        const args: Arg[] =
          mode === 'LOCK'
            ? ['RLOCK.ACQUIRE', key, owner, String(lease), 'TOKEN']
            : ['RWLOCK.ACQUIRE', key, owner, mode, String(lease), ...(mode === 'WRITE' ? ['TOKEN'] : [])];
        args.push('REQUEST', rid, ...extra);
        if (wait !== null) args.push('WAIT', String(wait));
        return args;
      },
      read: (reply) => {
        if (mode === 'READ') {
          if (reply === null) return { grant: 0n }; // read holds carry no token
          return { again: Number(reply) === 0 };
        }
        const [granted, value] = reply as [unknown, unknown];
        if (Number(granted) === 1) return { grant: BigInt(String(value)) };
        return { again: Number(value) === 0 };
      },
    };
    const base = this.opts.engine ?? rl;
    const engine: Engine = this.opts.fixedOwner ? this.#trackingEngine(base) : base;
    const run = (): ReturnType<typeof acquireOnce<bigint>> => acquireOnce(engine, spec, waitMs, signal);
    const got = this.opts.exclusive ? await this.opts.exclusive(signal, run) : await run();
    if (got === null) return null;
    if (this.opts.fixedOwner) await this.#dropStale(owner, lease);
    const renew = async (): Promise<boolean> => {
      const p = rl.conn.send(this.#renewArgs(owner, lease));
      if (this.opts.fixedOwner) this.#track(p);
      return Number(await p) === 1;
    };
    let start: number | null;
    try {
      start = await grantStart(got.sentAt, lease, renew, rl.responseTimeoutMs, signal);
    } catch (e) {
      await engine.cancel(key, got.rid, lease); // aborted while confirming: given back
      throw e;
    }
    if (start === null) {
      await engine.cancel(key, got.rid, lease); // not confirmed (gone, or no answer): given back
      return null;
    }
    const s = new Lease(this, lease, leaseMs === undefined, start, renew, rl.responseTimeoutMs);
    this.#current = { lease: s, owner, token: got.grant };
    this.opts.adopt?.(s, () => {
      const args: Arg[] =
        this.mode === 'LOCK' ? ['RLOCK.RELEASE', this.key, owner, 'REQUEST', newId()] : ['RWLOCK.RELEASE', this.key, owner, this.mode, 'REQUEST', newId()];
      rl.background(rl.resend(args, Math.max(now(), s.validUntil))).catch(() => {});
    });
    return new Hold(this, s, owner, got.grant);
  }

  /** An owner id used before may find its earlier hold still on the server (its lease ended
   * here a moment before the server's): the acquire then re-entered it. Its count above 1 is
   * dropped, so one release frees it. */
  async #dropStale(owner: string, lease: number): Promise<void> {
    const field = this.mode === 'WRITE' ? `${owner}:write` : owner;
    try {
      const n = Number(await bounded(this.rl.conn.send(['HGET', this.key, field]), this.rl.responseTimeoutMs, 'HGET'));
      for (let i = n; i > 1; i--) {
        const args: Arg[] = this.mode === 'LOCK' ? ['RLOCK.RELEASE', this.key, owner, String(lease)] : ['RWLOCK.RELEASE', this.key, owner, this.mode];
        await bounded(this.rl.conn.send(args), this.rl.responseTimeoutMs, 'RELEASE');
      }
    } catch {
      // no answer: the stale count ends with the lease at worst
    }
  }

  /** The engine with this side's cancels tracked until answered. */
  #trackingEngine(base: Engine): Engine {
    const rl = this.rl;
    return {
      conn: base.conn,
      responseTimeoutMs: base.responseTimeoutMs,
      get closes() {
        return base.closes;
      },
      openWait: (signal, key, options) => base.openWait(signal, key, options),
      closeWait: (c, flush) => base.closeWait(c, flush),
      ...(base.doneWait ? { doneWait: (c: Connection) => base.doneWait!(c) } : {}),
      cancel: async (key, rid, leaseMs) => {
        const horizon = now() + (leaseMs || REQUEST_RECORD_MS) + rl.responseTimeoutMs;
        const task = this.#track(rl.background(rl.resend(['RLOCK.CANCEL', key, rid], horizon)));
        await bounded(task, 2 * rl.responseTimeoutMs, 'RLOCK.CANCEL').catch(() => {});
      },
    };
  }

  /** @internal The last release of a hold. */
  async releaseLease(s: Lease, owner: string): Promise<void> {
    // no longer this side's hold from now on: an acquire meanwhile is a fresh one (an owner's
    // waits for this release), never a re-entry of the hold being released
    const cur = this.#current;
    if (cur?.lease === s) this.#current = null;
    try {
      await this.#release(s, owner);
    } catch (e) {
      // refused by the server: still held (the caller may retry)
      if (e instanceof RLockError && !(e instanceof LockLost) && this.#current === null && cur?.lease === s && !s.lost) this.#current = cur;
      throw e;
    }
  }

  async #release(s: Lease, owner: string): Promise<void> {
    const rl = this.rl;
    const args: Arg[] =
      this.mode === 'LOCK'
        ? ['RLOCK.RELEASE', this.key, owner, 'REQUEST', newId()]
        : ['RWLOCK.RELEASE', this.key, owner, this.mode, 'REQUEST', newId()];
    const first = now();
    let reply: unknown;
    if (this.opts.fixedOwner) {
      const task = this.#track(rl.background(rl.resend(args, Math.min(s.validUntil, first + RELEASE_RESEND_MS))));
      try {
        reply = await bounded(task, Math.max(0, Math.min(s.validUntil, first + 3 * rl.responseTimeoutMs) - first), 'RELEASE');
      } catch (e) {
        if (e instanceof ServerError && !transientReply(e)) throw fromReply(e.message, this.label);
        reply = undefined; // sent on in the background; the next fresh grant waits for it
      }
    } else {
      reply = await rl.giveBack(args, this.label, Math.min(s.validUntil, first + 3 * rl.responseTimeoutMs), Math.min(s.validUntil, first + RELEASE_RESEND_MS));
    }
    if (reply === null) {
      s.markLost('the release found it gone');
      s.end();
      throw s.lostError();
    }
    s.end();
  }

  /** @internal */
  dropped(s: Lease): void {
    if (this.#current?.lease === s) this.#current = null;
  }
}

