import type { Arg, Connection, SendOptions } from './adapter.js';

/** Idle wait connections kept at most (all keys together). */
export const POOL_MAX_IDLE = 64;
/** An idle wait connection is closed after this many ms unused. */
export const POOL_IDLE_MS = 10000;

interface Idle {
  conn: Connection;
  timer: NodeJS.Timeout;
  stopWatch: () => void;
}

/**
 * Dedicated wait connections kept for the next wait once their wait ended cleanly (its reply
 * read, so nothing is pending on them), instead of a connection opened and closed per wait.
 *
 * A connection is only ever given back by the acquire that used it and read its last reply; one
 * whose wait ended any other way (an abort or a timeout with the command in flight, a failed
 * connection, an error reply) is closed, which ends its wait in the server; when its connection
 * failed or a failover answered, the idle connections opened for the same key (`poolKey`: the
 * same server, and in a cluster the same slot) are closed with it: they may point to the old
 * master. An idle connection
 * does not keep the process alive (`unref`), closes itself after {@link POOL_IDLE_MS}, and leaves
 * the pool when it dies.
 */
export class WaitPool {
  readonly #idle = new Map<string, Idle[]>();
  readonly #keyOf = new WeakMap<Connection, string>();
  #count = 0;
  #closed = false;

  /** An idle connection for `poolKey`, or null. */
  take(poolKey: string | undefined): Connection | null {
    if (poolKey === undefined) return null;
    const list = this.#idle.get(poolKey);
    const it = list?.pop();
    if (it === undefined) return null;
    if (list!.length === 0) this.#idle.delete(poolKey);
    this.#count--;
    clearTimeout(it.timer);
    it.stopWatch();
    it.conn.ref?.();
    return it.conn;
  }

  /** Remembers that `conn` was opened for `poolKey` (so it may come back). */
  opened(conn: Connection, poolKey: string | undefined): void {
    if (poolKey !== undefined) this.#keyOf.set(conn, poolKey);
  }

  /** `conn`'s wait ended with its reply read: kept for the next wait, or closed when the pool
   * is full or closed. */
  async giveBack(conn: Connection): Promise<void> {
    const poolKey = this.#keyOf.get(conn);
    if (poolKey === undefined || this.#closed || this.#count >= POOL_MAX_IDLE) {
      await conn.close().catch(() => {});
      return;
    }
    const it: Idle = {
      conn,
      timer: setTimeout(() => void this.#drop(poolKey, it), POOL_IDLE_MS),
      stopWatch: () => {},
    };
    it.timer.unref();
    it.stopWatch = conn.onDeath(() => void this.#drop(poolKey, it));
    conn.unref?.();
    let list = this.#idle.get(poolKey);
    if (list === undefined) this.#idle.set(poolKey, (list = []));
    list.push(it);
    this.#count++;
  }

  /** `conn`'s wait ended otherwise: closed; with `flush` (its connection failed, or a failover
   * answered), the idle connections of its key with it. */
  async discard(conn: Connection, flush: boolean): Promise<void> {
    const poolKey = this.#keyOf.get(conn);
    await conn.close().catch(() => {});
    if (flush && poolKey !== undefined) await this.#closeKey(poolKey);
  }

  /** Closes every idle connection; later give-backs are closed. */
  async close(): Promise<void> {
    this.#closed = true;
    await Promise.allSettled([...this.#idle.keys()].map((k) => this.#closeKey(k)));
  }

  /** Idle connections kept now. */
  get size(): number {
    return this.#count;
  }

  async #closeKey(poolKey: string): Promise<void> {
    const list = this.#idle.get(poolKey) ?? [];
    await Promise.allSettled([...list].map((it) => this.#drop(poolKey, it)));
  }

  async #drop(poolKey: string, it: Idle): Promise<void> {
    const list = this.#idle.get(poolKey);
    const i = list?.indexOf(it) ?? -1;
    if (i === -1) return; // taken meanwhile, or dropped already
    list!.splice(i, 1);
    if (list!.length === 0) this.#idle.delete(poolKey);
    this.#count--;
    clearTimeout(it.timer);
    it.stopWatch();
    await it.conn.close().catch(() => {});
  }
}

/** The pool key of a wait on `key` with `options` for a connection whose waits all go to one
 * server (a single server, the master behind Sentinel): whether integers come exact matters for
 * ioredis, whose connections are made so. */
export function serverPoolKey(_key?: Arg, options?: SendOptions): string {
  return options?.exactNumbers ? 'exact' : 'plain';
}
