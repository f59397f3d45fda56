/**
 * Migration facades: the shapes of `redis-semaphore` (`Mutex`, `Semaphore`, `MultiSemaphore`)
 * and of `redlock` (`using()`), backed by this package's server-side waits. The differences are
 * in the README ("Coming from redis-semaphore or redlock").
 */
import { InvalidArgument, LockLost, LockTimeout, NotHeld } from './errors.js';
import { RLock, type Hold } from './lock.js';
import { MAX_LEASED_PERMITS, type LeasedPermits } from './semaphore.js';
import * as V from './validate.js';

const rlocks = new WeakMap<object, Map<number, RLock>>();

/** The RLock of `client` whose watchdog lease is `leaseMs` (one per client and lease). */
function rlockOf(client: unknown, leaseMs: number): RLock {
  if (client instanceof RLock) return client;
  if (client === null || typeof client !== 'object') return new RLock(client);
  let byLease = rlocks.get(client);
  if (byLease === undefined) rlocks.set(client, (byLease = new Map()));
  let rl = byLease.get(leaseMs);
  if (rl === undefined) byLease.set(leaseMs, (rl = new RLock(client, { watchdogMs: Math.max(leaseMs, V.MIN_WATCHDOG_MS) })));
  return rl;
}

/** `redis-semaphore`'s options (`retryInterval`, `acquireAttemptsLimit` > 1 and `identifier`
 * are accepted and not used: the wait is in the server). */
export interface MutexOptions {
  /** The hold's lease (default 10000 ms), renewed until release unless `refreshInterval` is 0. */
  lockTimeout?: number;
  /** How long `acquire()` waits (default 10000 ms). */
  acquireTimeout?: number;
  /** 1: `acquire()` tries once. */
  acquireAttemptsLimit?: number;
  /** 0: no renewal (the hold ends after `lockTimeout`); any other value: renewed by the
   * watchdog every third of `lockTimeout`. */
  refreshInterval?: number;
  retryInterval?: number;
  identifier?: string;
  /** Called when a hold is lost (its renewal found it gone, its lease ended). */
  onLockLost?: (err: Error) => void;
}

const MUTEX_KEYS = ['lockTimeout', 'acquireTimeout', 'acquireAttemptsLimit', 'refreshInterval', 'retryInterval', 'identifier', 'onLockLost'] as const;

interface Parsed {
  lockTimeout: number;
  acquireTimeout: number;
  once: boolean;
  renew: boolean;
  onLockLost: ((err: Error) => void) | undefined;
}

function parse(options: unknown, what: string): Parsed {
  const o = V.options(options, what);
  V.known(o, MUTEX_KEYS, what);
  const lost = o.onLockLost;
  if (lost !== undefined && typeof lost !== 'function') throw new InvalidArgument(`${what}: onLockLost must be a function`);
  return {
    lockTimeout: V.ms(o.lockTimeout, 'lockTimeout', 1) ?? 10000,
    acquireTimeout: V.ms(o.acquireTimeout, 'acquireTimeout', 0) ?? 10000,
    once: o.acquireAttemptsLimit === 1,
    renew: o.refreshInterval !== 0,
    onLockLost: lost as ((err: Error) => void) | undefined,
  };
}

/** What holds: a lock's Hold or leased permits. */
type Held = Hold | LeasedPermits;

abstract class Facade<H extends Held> {
  protected readonly o: Parsed;
  protected readonly rl: RLock;
  #held: H | null = null;

  constructor(client: unknown, readonly key: string, options: unknown, what: string) {
    if (typeof key !== 'string' || key === '') throw new InvalidArgument(`${what} needs a key (a non-empty string)`);
    this.o = parse(options, `${what} options`);
    this.rl = rlockOf(client, this.o.lockTimeout);
  }

  protected abstract take(waitMs: number): Promise<H | null>;

  /** Whether it holds (a live hold). */
  get isAcquired(): boolean {
    return this.#held !== null && !this.#held.lost;
  }

  /** Waits in the server up to `acquireTimeout`; `LockTimeout` when not taken. */
  async acquire(): Promise<void> {
    if (!(await this.#get(this.o.once ? 0 : this.o.acquireTimeout))) {
      throw new LockTimeout(`${this.key} was not acquired within ${this.o.acquireTimeout} ms`, this.key);
    }
  }

  /** One try: whether it was taken. */
  async tryAcquire(): Promise<boolean> {
    return this.#get(0);
  }

  async #get(waitMs: number): Promise<boolean> {
    if (this.isAcquired) throw new InvalidArgument(`${this.key} is already acquired by this instance`);
    const h = await this.take(waitMs);
    if (h === null) return false;
    this.#held = h;
    const lost = this.o.onLockLost;
    h.signal.addEventListener('abort', () => {
      if (this.#held === h && lost !== undefined) lost(h.signal.reason as Error);
    }, { once: true });
    return true;
  }

  /** Gives it back; nothing when not held (or lost meanwhile). */
  async release(): Promise<void> {
    const h = this.#held;
    this.#held = null;
    if (h === null) return;
    try {
      await h.release();
    } catch (e) {
      if (!(e instanceof NotHeld)) throw e; // LockLost included: nothing to give back
    }
  }
}

/** `redis-semaphore`'s `Mutex`: `new Mutex(client, key, options)`; `acquire()`, `tryAcquire()`,
 * `release()`, `isAcquired`, `onLockLost`. The lock is the rlock named `key`. */
export class Mutex extends Facade<Hold> {
  constructor(client: unknown, key: string, options?: MutexOptions) {
    super(client, key, options, 'Mutex');
  }

  protected take(waitMs: number): Promise<Hold | null> {
    const leaseMs = this.o.renew ? undefined : this.o.lockTimeout;
    return this.rl.lock(this.key).tryAcquire({ waitMs, ...(leaseMs === undefined ? {} : { leaseMs }) });
  }
}

/** `redis-semaphore`'s `MultiSemaphore`: `permits` of a semaphore of `limit` (leased permits,
 * renewed until release unless `refreshInterval` is 0). The server keeps the limit it was first
 * given (`RSEM.SETPERMITS`). */
export class MultiSemaphore extends Facade<LeasedPermits> {
  #set = false;

  constructor(client: unknown, key: string, readonly limit: number, readonly permits: number, options?: MutexOptions) {
    super(client, key, options, 'MultiSemaphore');
    V.int(limit, 'limit', 1, Number.MAX_SAFE_INTEGER);
    V.int(permits, 'permits', 1, MAX_LEASED_PERMITS);
    if (permits > limit) throw new InvalidArgument(`permits (${permits}) above the limit (${limit})`);
  }

  protected async take(waitMs: number): Promise<LeasedPermits | null> {
    const sem = this.rl.leasedSemaphore(this.key);
    if (!this.#set) {
      await sem.trySetPermits(this.limit);
      this.#set = true;
    }
    const leaseMs = this.o.renew ? undefined : this.o.lockTimeout;
    return sem.tryAcquire({ permits: this.permits, waitMs, ...(leaseMs === undefined ? {} : { leaseMs }) });
  }
}

/** `redis-semaphore`'s `Semaphore`: one permit of a semaphore of `limit`. */
export class Semaphore extends MultiSemaphore {
  constructor(client: unknown, key: string, limit: number, options?: MutexOptions) {
    super(client, key, limit, 1, options);
  }
}

/** `redlock`'s settings (`driftFactor`, `retryJitter`, `automaticExtensionThreshold` accepted,
 * not used). The wait for the locks is `retryCount × retryDelay` (default 10 × 200 ms; a
 * negative `retryCount`: no limit), in the server. */
export interface RedlockSettings {
  retryCount?: number;
  retryDelay?: number;
  driftFactor?: number;
  retryJitter?: number;
  automaticExtensionThreshold?: number;
}

const REDLOCK_KEYS = ['retryCount', 'retryDelay', 'driftFactor', 'retryJitter', 'automaticExtensionThreshold'] as const;

/** `settings` checked: known names, `retryCount` a whole number (negative: no limit),
 * `retryDelay` a duration; the others, not used, numbers. */
function redlockSettings(settings: unknown, what: string): RedlockSettings {
  const o = V.options(settings, what);
  V.known(o, REDLOCK_KEYS, what);
  if (o.retryCount !== undefined) V.int(o.retryCount, 'retryCount', -Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
  V.ms(o.retryDelay, 'retryDelay', 0);
  for (const k of ['driftFactor', 'retryJitter', 'automaticExtensionThreshold'] as const) {
    const v = o[k];
    if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v) || v < 0)) {
      throw new InvalidArgument(`${what}: ${k} must be a finite number, not negative, got ${V.describe(v)}`);
    }
  }
  return o as RedlockSettings;
}

/** The signal `using()` hands its routine: aborted when a hold is lost, `error` its reason. */
export type RedlockAbortSignal = AbortSignal & { error?: Error };

/** `redlock`'s `using()` on one server (or one cluster): `new Redlock([client])`. */
export class Redlock {
  readonly #client: unknown;
  readonly #settings: RedlockSettings;

  constructor(clients: Iterable<unknown>, settings: RedlockSettings = {}) {
    const all = [...clients];
    if (all.length !== 1) {
      throw new InvalidArgument('this Redlock takes one client (one server, or a cluster client): a lock waits in that server');
    }
    this.#client = all[0];
    this.#settings = redlockSettings(settings, 'Redlock settings');
  }

  /** Runs `routine` holding every lock of `resources` (taken in sorted order, each with a lease
   * of `duration` ms renewed until the end); released when it settles. */
  async using<T>(resources: string[], duration: number, settings: RedlockSettings | ((signal: RedlockAbortSignal) => Promise<T>), routine?: (signal: RedlockAbortSignal) => Promise<T>): Promise<T> {
    if (typeof settings === 'function') {
      routine = settings;
      settings = {};
    }
    if (typeof routine !== 'function') throw new InvalidArgument('using() needs a routine');
    if (!Array.isArray(resources) || resources.length === 0) throw new InvalidArgument('using() needs resources');
    const s = { ...this.#settings, ...redlockSettings(settings, 'using() settings') };
    const count = s.retryCount ?? 10;
    const waitMs = count < 0 ? undefined : V.ms(count * (s.retryDelay ?? 200), 'retryCount × retryDelay', 0);
    const rl = rlockOf(this.#client, V.ms(duration, 'duration', 1)!);
    const controller = new AbortController();
    const signal = controller.signal as RedlockAbortSignal;
    const holds: Hold[] = [];
    try {
      for (const name of [...new Set(resources)].sort()) {
        const h = await rl.lock(name).acquire(waitMs === undefined ? {} : { waitMs });
        holds.push(h);
        h.signal.addEventListener('abort', () => {
          signal.error = h.signal.reason as Error;
          controller.abort(h.signal.reason);
        }, { once: true });
      }
      return await routine(signal);
    } finally {
      // every hold released, even when one release is refused (the others would be left to
      // their watchdogs, renewed for ever); then the first refusal is thrown
      const refused: unknown[] = [];
      for (const h of holds.reverse()) {
        await h.release().catch((e: unknown) => {
          if (!(e instanceof LockLost)) refused.push(e);
        });
      }
      if (refused.length > 0) throw refused[0];
    }
  }
}
