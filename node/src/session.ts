import type { Engine } from './acquiring.js';
import { IoRedisConnection, NodeRedisConnection, ServerError, type Arg, type Connection, type SendOptions } from './adapter.js';
import { SessionClosed } from './errors.js';
import type { Lease } from './lease.js';
import { Turns, type RLock } from './lock.js';
import { RWLock } from './rw.js';
import { Side, type SideOptions } from './side.js';
import { bounded } from './util.js';
import * as V from './validate.js';

export interface SessionOptions {
  /** After a hold of this session ended because its connection closed, nobody is granted the
   * lock for this long (`LOCKDELAY`, 0 to 60000 ms; default 0). */
  lockDelayMs?: number;
  /** How often the idle connection is pinged; a ping not answered within it closes the session
   * (default 1000 ms). */
  keepaliveMs?: number;
}

/**
 * A session (`await rlock.session({ lockDelayMs })`): one dedicated connection of its own (a
 * duplicate of the client's, never reconnected) whose `lock(name)` and `rwLock(name)` take
 * holds with `SESSION`: the server ends them as soon as that connection closes (`close()`, the
 * process dying, `CLIENT KILL`, a cut network seen by the keepalive), instead of at the end of
 * their leases. Then every hold taken through the session is lost at once (its signal aborts,
 * reason `LockLost`) and later acquires throw `SessionClosed`. Acquires run on the session's
 * connection one at a time (a waiting acquire holds it); renewals, releases and cancels go on
 * the client's own connection (a binding never moves).
 */
export class Session implements AsyncDisposable {
  /** The session's id (owner ids of its holds are `<id>:<handle>:<n>`). */
  readonly id: string;
  /** The server's id of the session's connection (`CLIENT ID`). */
  readonly clientId: number;
  readonly #rl: RLock;
  readonly #raw: Connection;
  readonly #turns = new Turns();
  readonly #controller = new AbortController();
  /** Live holds of the session, each with how to give it back from the client's connection. */
  readonly #leases = new Map<Lease, () => void>();
  readonly #extra: Arg[];
  readonly #unlisten: () => void;
  #timer: NodeJS.Timeout | undefined;
  #busy = 0;
  #looking = false;
  #closed = false;
  readonly #lockDelayMs: number;
  #handles = 0;

  private constructor(rl: RLock, id: string, raw: Connection, clientId: number, lockDelayMs: number, keepaliveMs: number) {
    this.#rl = rl;
    this.id = id;
    this.#raw = raw;
    this.clientId = clientId;
    this.#extra = lockDelayMs > 0 ? ['SESSION', 'LOCKDELAY', String(lockDelayMs)] : ['SESSION'];
    this.#lockDelayMs = lockDelayMs;
    this.#unlisten = raw.onDeath(() => void this.#end('its connection closed'));
    this.#timer = setInterval(() => void this.#ping(keepaliveMs), keepaliveMs);
    this.#timer.unref();
  }

  /** @internal */
  static async open(rl: RLock, id: string, options?: SessionOptions): Promise<Session> {
    const o = V.options(options, 'session options');
    V.known(o, ['lockDelayMs', 'keepaliveMs'], 'session options');
    const lockDelayMs = V.int(o.lockDelayMs, 'lockDelayMs', 0, 60000, 0);
    const keepaliveMs = V.ms(o.keepaliveMs, 'keepaliveMs', 10) ?? 1000;
    // integer replies as decimal strings (ioredis: `stringNumbers`): a session's fencing token may pass 2^53
    const raw = await bounded(rl.conn.duplicate(undefined, { exactNumbers: true }), rl.responseTimeoutMs * 2, 'connect');
    let clientId: number;
    try {
      // in the database the client is in now (a run-time SELECT), as its waits are
      const db = await rl.database();
      if (db !== undefined) await bounded(raw.send(['SELECT', String(db)]), rl.responseTimeoutMs, 'SELECT');
      clientId = Number(await bounded(raw.send(['CLIENT', 'ID']), rl.responseTimeoutMs, 'CLIENT ID'));
    } catch (e) {
      await raw.close().catch(() => {});
      throw e;
    }
    return new Session(rl, id, raw, clientId, lockDelayMs, keepaliveMs);
  }

  /** Whether the session is closed (its holds ended). */
  get closed(): boolean {
    return this.#closed;
  }

  /** Aborted (reason `SessionClosed`) when the session closes. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** A reentrant lock whose holds are this session's. */
  lock(name: string | Buffer): Side {
    const key = V.name(name);
    const handle = `${this.id}:${++this.#handles}`;
    let gen = 0;
    return new Side(this.#rl, key, 'LOCK', new Turns(), { ...this.#sideOptions(), ownerFor: () => `${handle}:${++gen}`, fixedOwner: false });
  }

  /** A read-write lock whose holds are this session's. */
  rwLock(name: string | Buffer): RWLock {
    return new RWLock(this.#rl, V.name(name), `${this.id}:${++this.#handles}`, undefined, this.#sideOptions());
  }

  /** Closes the connection (the server ends its holds at once); every hold taken through the
   * session is lost. Idempotent. */
  async close(): Promise<void> {
    await this.#end('it was closed');
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #sideOptions(): Omit<SideOptions, 'ownerFor' | 'fixedOwner'> {
    const rl = this.#rl;
    const conn: Connection = {
      send: (args: readonly Arg[], options?: SendOptions) => this.#send(args, options),
      duplicate: () => Promise.reject(new Error('a session has one connection')),
      close: async () => {},
      onDeath: (l) => this.#raw.onDeath(l),
    };
    const engine: Engine = {
      conn,
      responseTimeoutMs: rl.responseTimeoutMs,
      openWait: async () => {
        if (this.#closed) throw new SessionClosed('the session is closed');
        return conn;
      },
      closeWait: async () => {},
      cancel: (key, rid, leaseMs) => rl.cancel(key, rid, leaseMs),
    };
    return {
      engine,
      extra: this.#extra,
      exclusive: async (signal, fn) =>
        this.#turns.run(signal, async () => {
          this.#busy++;
          try {
            return await fn();
          } finally {
            this.#busy--;
          }
        }),
      adopt: (lease, giveBack) => {
        for (const l of this.#leases.keys()) if (l.ended || l.lost) this.#leases.delete(l);
        this.#leases.set(lease, giveBack);
        if (this.#closed) {
          lease.markLost('its session closed');
          giveBack();
        }
      },
    };
  }

  async #send(args: readonly Arg[], options?: SendOptions): Promise<unknown> {
    if (this.#closed) throw new SessionClosed('the session is closed');
    try {
      return await this.#raw.send(args, options);
    } catch (e) {
      if (e instanceof ServerError) throw e;
      await this.#end(`its connection failed: ${(e as Error).message}`);
      throw new SessionClosed(`the session's connection failed: ${(e as Error).message}`);
    }
  }

  async #ping(keepaliveMs: number): Promise<void> {
    if (this.#closed) return;
    if (this.#busy > 0) return this.#look(keepaliveMs);
    try {
      await bounded(this.#raw.send(['PING']), keepaliveMs, 'PING');
    } catch (e) {
      if (e instanceof ServerError) return; // an answer all the same
      await this.#end('its keepalive ping was not answered');
    }
  }

  /** While an acquire waits on the session's connection (a PING there would queue behind its
   * wait), asks the server from the client's own connection whether it still has the session's
   * (`CLIENT LIST ID`): gone, the server ended the session's holds, so the session ends (which
   * also ends the wait). No answer or an error reply (an ACL user without `CLIENT`) concludes
   * nothing. Only for a client of one server: a cluster or sentinel client might ask another. */
  async #look(keepaliveMs: number): Promise<void> {
    const conn = this.#rl.conn;
    if (this.#looking || !(conn instanceof NodeRedisConnection || conn instanceof IoRedisConnection)) return;
    this.#looking = true;
    try {
      const r = await bounded(conn.send(['CLIENT', 'LIST', 'ID', String(this.clientId)]), keepaliveMs, 'CLIENT LIST');
      if (typeof r === 'string' && r.trim() === '') await this.#end('the server no longer has its connection');
    } catch {
      // no conclusion
    } finally {
      this.#looking = false;
    }
  }

  async #end(why: string): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#timer);
    this.#unlisten();
    await this.#raw.close().catch(() => {});
    // the server that saw the connection close ended its holds; one that did not see it (a
    // replica promoted since, a server not yet aware of a cut network) would keep them to their
    // leases, held by nobody: each live hold is released from the client's own connection too
    // (a hold already ended answers nil; a lock delay's placeholder is no owner's hold), after
    // the lock delay when there is one, so that the delay holds on a server that did not see it
    const later: (() => void)[] = [];
    for (const [l, giveBack] of this.#leases) {
      if (l.ended || l.lost) continue;
      l.markLost(`its session closed: ${why}`);
      later.push(giveBack);
    }
    const giveAll = (): void => later.forEach((f) => f());
    if (this.#lockDelayMs > 0) setTimeout(giveAll, this.#lockDelayMs).unref();
    else giveAll();
    this.#leases.clear();
    this.#controller.abort(new SessionClosed(`the session closed: ${why}`));
  }
}
