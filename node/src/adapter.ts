import { InvalidArgument } from './errors.js';
import { serverPoolKey } from './pool.js';
import { adaptTopology } from './topology.js';

/**
 * What the client needs from a connection, and the two drivers' implementations of it.
 *
 * A {@link Connection} sends one command (an array of string or Buffer words) and resolves to the
 * raw reply; an error reply of the server rejects with a {@link ServerError}, anything else
 * (a broken or closed connection, a driver's own failure) rejects with the driver's error as it
 * is. `duplicate()` opens a dedicated connection to the same server (used for a wait in the
 * server, which blocks its connection); `close()` closes a duplicate; `onDeath()` tells when a
 * connection closed or failed.
 */

/** One word of a command. */
export type Arg = string | Buffer;

/** `buffers`: bulk string replies as Buffers (binary ids), else as strings. `exactNumbers`:
 * integer replies as decimal strings (a fencing token may pass 2^53), else as numbers. */
export interface SendOptions {
  buffers?: boolean;
  exactNumbers?: boolean;
}

export interface Connection {
  send(args: readonly Arg[], options?: SendOptions): Promise<unknown>;
  /** A dedicated connection; `key`: the key its commands are for (a cluster connects to the
   * node serving that key's slot). */
  duplicate(key?: Arg, options?: SendOptions): Promise<Connection>;
  close(): Promise<void>;
  /** Calls `listener` when the connection closes or fails; returns the function that stops it. */
  onDeath(listener: (err: Error) => void): () => void;
  /** Frees what this connection made for itself (not the user's client). */
  dispose?(): Promise<void>;
  /** Which of this connection's `duplicate(key, options)` may stand in for one another (the
   * same server, the same kind of replies): a wait connection that ended cleanly is kept for
   * the next wait of the same pool key. Absent: never kept. */
  poolKey?(key?: Arg, options?: SendOptions): string | undefined;
  /** The database this connection's commands run in now (a client may `SELECT` another at run
   * time; its duplicates are made from its options): its waits' connections are switched to it.
   * Undefined: unknown (a cluster, or the server refused to say), the duplicates' own. */
  database?(): Promise<number | undefined>;
  /** Whether this (dedicated) connection keeps the process alive: `unref` while kept idle. */
  ref?(): void;
  unref?(): void;
  /** Whether it was closed for good (by its owner; it will not reconnect): a command sent again
   * on it can never be answered, so nothing is sent again (a background resend would otherwise
   * keep the process alive for a minute after the user closed the client). */
  closed?(): boolean;
}

/** node-redis's command options for `options`: 36, RESP's blob string type ('$'), mapped to
 * Buffer; 58, its integer type (':'), to String. */
export function typeMapping(options?: SendOptions): object | undefined {
  if (!options?.buffers && !options?.exactNumbers) return undefined;
  const m: Record<number, unknown> = {};
  if (options.buffers) m[36] = Buffer;
  if (options.exactNumbers) m[58] = String;
  return { typeMapping: m };
}

/** An error reply of the server (whatever the driver's own class for it). */
export class ServerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ServerError';
  }
}

/** Whether `err` is a driver's error reply: node-redis's `ErrorReply` (and its subclasses),
 * ioredis's `ReplyError`. Read by class name: neither driver is a dependency of this package. */
function isErrorReply(err: unknown): err is Error {
  if (!(err instanceof Error)) return false;
  if (err.name === 'ReplyError') return true;
  for (let p = Object.getPrototypeOf(err); p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const n = (p as { constructor?: { name?: string } }).constructor?.name;
    if (n === 'ErrorReply' || n === 'ReplyError') return true;
  }
  return false;
}

export function normalize(err: unknown): unknown {
  return isErrorReply(err) ? new ServerError(err.message) : err;
}

interface Emitter {
  on(event: string, listener: (...args: unknown[]) => void): unknown;
  off?(event: string, listener: (...args: unknown[]) => void): unknown;
  removeListener?(event: string, listener: (...args: unknown[]) => void): unknown;
}

export function listen(c: Emitter, events: readonly string[], listener: (err: Error) => void): () => void {
  const fns = events.map((ev) => {
    const f = (e?: unknown): void => listener(e instanceof Error ? e : new Error(`connection ${ev}`));
    c.on(ev, f as (...args: unknown[]) => void);
    return [ev, f] as const;
  });
  return () => {
    for (const [ev, f] of fns) {
      if (c.off) c.off(ev, f as (...args: unknown[]) => void);
      else c.removeListener?.(ev, f as (...args: unknown[]) => void);
    }
  };
}

/** node-redis v5 (`createClient()`): `sendCommand`, `duplicate()`. */
export interface NodeRedisClient extends Emitter {
  sendCommand(args: Arg[], options?: object): Promise<unknown>;
  duplicate(overrides?: object): NodeRedisClient;
  connect(): Promise<unknown>;
  destroy(): void;
  readonly isOpen: boolean;
  readonly options?: { socket?: object };
  ref?(): void;
  unref?(): void;
}

/** A dedicated connection made from the node-redis client `c` (to `at` instead of its server,
 * when given). It never reconnects nor queues: a wait on a connection that went is answered by
 * the acquire itself (it cancels its request, or asks again). */
export async function dialNodeRedis(c: NodeRedisClient, at?: { host: string; port: number }): Promise<Connection> {
  const socket = { ...(c.options?.socket ?? {}), ...(at ?? {}), reconnectStrategy: false };
  const d = c.duplicate({ socket, disableOfflineQueue: true });
  d.on('error', () => {}); // reported by onDeath and by the pending command's rejection
  await d.connect();
  return new NodeRedisConnection(d);
}

/** The `db=` field of `CLIENT INFO` on `conn`; undefined when refused (an ACL without
 * `client|info`, a server before 6.2: then never asked again, `state.refused`). */
async function clientInfoDb(conn: Connection, state: { refused: boolean }): Promise<number | undefined> {
  if (state.refused) return undefined;
  try {
    const m = / db=(\d+)/.exec(String(await conn.send(['CLIENT', 'INFO'])));
    return m ? Number(m[1]) : undefined;
  } catch (e) {
    if (e instanceof ServerError) state.refused = true;
    return undefined;
  }
}

export class NodeRedisConnection implements Connection {
  readonly #info = { refused: false };

  constructor(private readonly c: NodeRedisClient) {}

  /** node-redis keeps the database a `select()` switched to to itself: the server says. */
  database(): Promise<number | undefined> {
    return clientInfoDb(this, this.#info);
  }

  async send(args: readonly Arg[], options?: SendOptions): Promise<unknown> {
    try {
      return await this.c.sendCommand([...args], typeMapping(options));
    } catch (e) {
      throw normalize(e);
    }
  }

  duplicate(): Promise<Connection> {
    return dialNodeRedis(this.c);
  }

  poolKey(key?: Arg, options?: SendOptions): string {
    return serverPoolKey(key, options);
  }

  ref(): void {
    this.c.ref?.();
  }

  unref(): void {
    this.c.unref?.();
  }

  async close(): Promise<void> {
    if (this.c.isOpen) this.c.destroy();
  }

  closed(): boolean {
    return !this.c.isOpen; // closed by close()/destroy()/quit(); true while it reconnects
  }

  onDeath(listener: (err: Error) => void): () => void {
    return listen(this.c, ['error', 'end'], listener);
  }
}

/** ioredis v5 (`new Redis()`): `call`, `duplicate()`. */
export interface IoRedisClient extends Emitter {
  call(command: string, ...args: Arg[]): Promise<unknown>;
  callBuffer(command: string, ...args: Arg[]): Promise<unknown>;
  duplicate(overrides?: object): IoRedisClient;
  connect(): Promise<unknown>;
  disconnect(): void;
  readonly status: string;
}

/** A dedicated connection made from the ioredis client `c` (to `at` instead of its server, when
 * given): no reconnection, no offline queue, no resend. With `sentinels` in its options, it
 * asks them for the master as it connects. */
export async function dialIoRedis(c: IoRedisClient, at?: { host: string; port: number }, options?: SendOptions): Promise<Connection> {
  const exact = options?.exactNumbers === true;
  const d = c.duplicate({
    ...(at ?? {}),
    ...(exact ? { stringNumbers: true } : {}),
    lazyConnect: true,
    enableOfflineQueue: false,
    autoResendUnfulfilledCommands: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    // behind Sentinel: one round of asking the sentinels, not a retry without end (a wait
    // whose connection cannot be made is asked again by its acquire, within its time)
    sentinelRetryStrategy: () => null,
  });
  d.on('error', () => {});
  await d.connect();
  return new IoRedisConnection(d, exact, true);
}

export class IoRedisConnection implements Connection {
  #twin: IoRedisClient | null = null;

  /** `exact`: made with `stringNumbers` (integer replies as strings); `dedicated`: a connection
   * of its own (a wait's, a session's), whose commands must run on it: never on a twin. */
  constructor(
    private readonly c: IoRedisClient,
    private readonly exact = false,
    private readonly dedicated = false,
  ) {}

  /** ioredis reads integers as strings only on a connection made so (`stringNumbers`): a
   * command that needs them exact goes to a twin of the user's client made so, at first use
   * (it reconnects as the client does; its socket does not keep the process alive). */
  #exactClient(): IoRedisClient {
    if (this.#twin === null) {
      const t = this.c.duplicate({ stringNumbers: true });
      t.on('error', () => {});
      t.on('connect', () => (t as unknown as { stream?: { unref?(): void } }).stream?.unref?.());
      const end = (): void => {
        this.c.off?.('end', end);
        t.disconnect();
        if (this.#twin === t) this.#twin = null;
      };
      this.c.on('end', end); // goes when the user's client ends
      this.#twin = t;
    }
    return this.#twin;
  }

  /** ioredis's own record of the database its connection is in now (`select()` sets it). */
  #selected(c: IoRedisClient): number | undefined {
    const db = (c as unknown as { condition?: { select?: unknown } }).condition?.select;
    return typeof db === 'number' ? db : undefined;
  }

  async database(): Promise<number | undefined> {
    return this.#selected(this.c);
  }

  async send(args: readonly Arg[], options?: SendOptions): Promise<unknown> {
    const [cmd, ...rest] = args;
    const c = options?.exactNumbers && !this.exact && !this.dedicated ? this.#exactClient() : this.c;
    if (c !== this.c) {
      // the twin runs in the database the user's client is in now (a run-time SELECT)
      const db = this.#selected(this.c);
      if (db !== undefined && this.#selected(c) !== db) await (c as unknown as { select(db: number): Promise<unknown> }).select(db).catch(() => {});
    }
    try {
      if (options?.buffers) return await c.callBuffer(String(cmd), ...rest);
      return await c.call(String(cmd), ...rest);
    } catch (e) {
      throw normalize(e);
    }
  }

  duplicate(_key?: Arg, options?: SendOptions): Promise<Connection> {
    return dialIoRedis(this.c, undefined, options);
  }

  poolKey(key?: Arg, options?: SendOptions): string {
    return serverPoolKey(key, options);
  }

  ref(): void {
    (this.c as unknown as { stream?: { ref?(): void } }).stream?.ref?.();
  }

  unref(): void {
    (this.c as unknown as { stream?: { unref?(): void } }).stream?.unref?.();
  }

  async close(): Promise<void> {
    this.c.disconnect();
    await this.dispose();
  }

  closed(): boolean {
    return this.c.status === 'end'; // disconnect()/quit(), or its retryStrategy gave up
  }

  async dispose(): Promise<void> {
    this.#twin?.disconnect();
    this.#twin = null;
  }

  onDeath(listener: (err: Error) => void): () => void {
    return listen(this.c, ['error', 'close', 'end'], listener);
  }
}

function isConnection(x: object): x is Connection {
  const c = x as Partial<Connection>;
  return typeof c.send === 'function' && typeof c.duplicate === 'function' && typeof c.close === 'function' && typeof c.onDeath === 'function';
}

/** The {@link Connection} of a node-redis v5 client (`createClient`, `createCluster`,
 * `createSentinel`), an ioredis v5 client (`new Redis`, with `sentinels` too, `new Cluster`), or
 * a ready-made one. */
export function adapt(client: unknown): Connection {
  if (client === null || typeof client !== 'object') {
    throw new InvalidArgument('rlock needs a connected node-redis or ioredis client');
  }
  if (isConnection(client)) return client;
  const topo = adaptTopology(client);
  if (topo !== null) return topo;
  const c = client as Record<string, unknown>;
  if (typeof c.call === 'function' && typeof c.duplicate === 'function' && typeof c.status === 'string') {
    return new IoRedisConnection(client as unknown as IoRedisClient);
  }
  if (typeof c.sendCommand === 'function' && typeof c.duplicate === 'function' && 'isOpen' in c) {
    return new NodeRedisConnection(client as unknown as NodeRedisClient);
  }
  throw new InvalidArgument('rlock needs a connected node-redis (v5) or ioredis (v5) client');
}
