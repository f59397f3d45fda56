import {
  dialIoRedis,
  dialNodeRedis,
  listen,
  normalize,
  typeMapping,
  ServerError,
  type Arg,
  type Connection,
  type IoRedisClient,
  type NodeRedisClient,
  type SendOptions,
} from './adapter.js';
import { serverPoolKey } from './pool.js';

/**
 * Redis Cluster and Sentinel through the two drivers.
 *
 * In a cluster a command goes where its key's slot is served (every rlock command's key is its
 * first argument), following `MOVED` and `ASK` as the driver does; a wait gets a dedicated
 * connection to the master serving the key's slot, which follows `MOVED` and `ASK` itself (to a
 * dedicated connection to the node named). Behind Sentinel, commands go to the master the driver
 * knows; a wait's dedicated connection is made to the master of the moment.
 */

// CRC16/XMODEM, as Redis Cluster hashes keys
const CRC_TABLE = (() => {
  const t = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i << 8;
    for (let j = 0; j < 8; j++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
    t[i] = c;
  }
  return t;
})();

/** The cluster slot of `key` (its hash tag's, when it has one). */
export function slotOf(key: Arg): number {
  let b = typeof key === 'string' ? Buffer.from(key) : key;
  const open = b.indexOf(0x7b); // {
  if (open !== -1) {
    const close = b.indexOf(0x7d, open + 1); // }
    if (close > open + 1) b = b.subarray(open + 1, close);
  }
  let crc = 0;
  for (const x of b) crc = ((crc << 8) & 0xffff) ^ CRC_TABLE[((crc >> 8) ^ x) & 0xff]!;
  return crc & 16383;
}

/** What a cluster connection needs of its driver. */
interface ClusterDriver {
  /** Sends `args` (for `key`) to where its slot is served, following redirections. */
  send(key: Arg | undefined, args: readonly Arg[], options?: SendOptions): Promise<unknown>;
  /** A dedicated connection to the master serving `slot` (per the driver's slot map). */
  dialSlot(slot: number, options?: SendOptions): Promise<Connection>;
  /** A dedicated connection to the node at `address` (`host:port`). */
  dialAddress(address: string, options?: SendOptions): Promise<Connection>;
  /** Asks the cluster for its slot map again (in the background). */
  refresh(): void;
  onDeath(listener: (err: Error) => void): () => void;
  /** Frees what the driver made for itself (not the user's client). */
  dispose?(): Promise<void>;
}

const redirect = (e: unknown): { ask: boolean; address: string } | null => {
  if (!(e instanceof ServerError)) return null;
  const m = /^(MOVED|ASK) \d+ (\S+)/.exec(e.message);
  return m ? { ask: m[1] === 'ASK', address: m[2]! } : null;
};

/** At most this many redirections of one command of a wait. */
const MAX_REDIRECTIONS = 5;

/** A cluster's {@link Connection}: the user's cluster client for short commands. */
class ClusterConnection implements Connection {
  constructor(private readonly d: ClusterDriver) {}

  send(args: readonly Arg[], options?: SendOptions): Promise<unknown> {
    return this.d.send(args[1], args, options);
  }

  async duplicate(key?: Arg, options?: SendOptions): Promise<Connection> {
    const slot = key === undefined ? 0 : slotOf(key);
    try {
      return new ClusterWait(this.d, await this.d.dialSlot(slot, options), options);
    } catch (e) {
      this.d.refresh(); // the node may be gone: the next attempt asks the map again
      throw e;
    }
  }

  poolKey(key?: Arg, options?: SendOptions): string {
    return `${key === undefined ? 0 : slotOf(key)}:${options?.exactNumbers ? 'exact' : 'plain'}`;
  }

  async close(): Promise<void> {}

  onDeath(listener: (err: Error) => void): () => void {
    return this.d.onDeath(listener);
  }

  async dispose(): Promise<void> {
    await this.d.dispose?.();
  }
}

/** A wait's dedicated connection in a cluster: follows `MOVED` (to the node named, the slot map
 * refreshed meanwhile) and `ASK` (`ASKING` first) with the same command; a connection that fails
 * has the slot map refreshed for the next attempt. */
class ClusterWait implements Connection {
  readonly #deaths = new Set<(err: Error) => void>();
  #stop: () => void = () => {};

  constructor(
    private readonly d: ClusterDriver,
    private inner: Connection,
    private readonly options?: SendOptions,
  ) {
    this.#watch();
  }

  #watch(): void {
    this.#stop();
    this.#stop = this.inner.onDeath((e) => {
      for (const f of this.#deaths) f(e);
    });
  }

  async #moveTo(address: string): Promise<void> {
    const next = await this.d.dialAddress(address, this.options);
    await this.inner.close().catch(() => {});
    this.inner = next;
    this.#watch();
  }

  async send(args: readonly Arg[], options?: SendOptions): Promise<unknown> {
    for (let i = 0; ; i++) {
      try {
        return await this.inner.send(args, options);
      } catch (e) {
        const r = redirect(e);
        if (r === null) {
          if (!(e instanceof ServerError)) this.d.refresh();
          throw e;
        }
        if (i >= MAX_REDIRECTIONS) throw e;
        if (!r.ask) this.d.refresh();
        try {
          await this.#moveTo(r.address);
        } catch (e2) {
          this.d.refresh();
          throw e2;
        }
        if (r.ask) await this.inner.send(['ASKING']);
      }
    }
  }

  duplicate(key?: Arg, options?: SendOptions): Promise<Connection> {
    return new ClusterConnection(this.d).duplicate(key, options);
  }

  ref(): void {
    this.inner.ref?.();
  }

  unref(): void {
    this.inner.unref?.();
  }

  async close(): Promise<void> {
    this.#stop();
    await this.inner.close();
  }

  onDeath(listener: (err: Error) => void): () => void {
    this.#deaths.add(listener);
    return () => this.#deaths.delete(listener);
  }
}

function hostPort(address: string): { host: string; port: number } {
  const i = address.lastIndexOf(':');
  return { host: address.slice(0, i), port: Number(address.slice(i + 1)) };
}

/** node-redis v5 `createCluster()`. */
interface NodeRedisCluster {
  sendCommand(firstKey: Arg | undefined, isReadonly: boolean | undefined, args: Arg[], options?: object): Promise<unknown>;
  readonly slots: ({ master: NodeRedisNode } | undefined)[];
  readonly masters: NodeRedisNode[];
  readonly nodeByAddress: Map<string, NodeRedisNode>;
  nodeClient(node: NodeRedisNode): NodeRedisClient | Promise<NodeRedisClient>;
  readonly _slots?: { rediscover(startWith: NodeRedisClient): Promise<void> };
  on(event: string, listener: (...args: unknown[]) => void): unknown;
  off?(event: string, listener: (...args: unknown[]) => void): unknown;
}
interface NodeRedisNode {
  host: string;
  port: number;
  address?: string;
}

function nodeRedisCluster(c: NodeRedisCluster): ClusterDriver {
  const anyClient = async (): Promise<NodeRedisClient> => c.nodeClient(c.masters[0]!);
  return {
    async send(key, args, options) {
      try {
        return await c.sendCommand(key, false, [...args], typeMapping(options));
      } catch (e) {
        throw normalize(e);
      }
    },
    async dialSlot(slot) {
      const node = c.slots[slot]?.master;
      if (node === undefined) throw new Error(`no master serves slot ${slot}`);
      return dialNodeRedis(await c.nodeClient(node));
    },
    async dialAddress(address) {
      const node = c.nodeByAddress.get(address);
      if (node !== undefined) return dialNodeRedis(await c.nodeClient(node));
      return dialNodeRedis(await anyClient(), hostPort(address));
    },
    refresh() {
      void anyClient()
        .then((cl) => c._slots?.rediscover(cl))
        .catch(() => {});
    },
    onDeath(listener) {
      return listen(c, ['end'], listener);
    },
  };
}

/** ioredis v5 `new Cluster()`. */
interface IoRedisCluster {
  readonly isCluster: true;
  readonly slots: (string[] | undefined)[];
  readonly connectionPool: { getInstanceByKey(key: string): IoRedisClient | undefined; getNodes(role?: string): IoRedisClient[] };
  readonly options: { redisOptions?: object };
  duplicate(startupNodes?: unknown[], options?: object): IoRedisCluster;
  disconnect(): void;
  sendCommand(command: unknown, stream?: unknown, node?: unknown): Promise<unknown>;
  call(command: string, ...args: Arg[]): Promise<unknown>;
  callBuffer(command: string, ...args: Arg[]): Promise<unknown>;
  refreshSlotsCache(callback?: (err?: Error) => void): void;
  on(event: string, listener: (...args: unknown[]) => void): unknown;
  off?(event: string, listener: (...args: unknown[]) => void): unknown;
}

function ioRedisCluster(c: IoRedisCluster): ClusterDriver {
  const anyNode = (): IoRedisClient => {
    const n = c.connectionPool.getNodes('master')[0] ?? c.connectionPool.getNodes('all')[0];
    if (n === undefined) throw new Error('the cluster client knows no node yet');
    return n;
  };
  // ioredis reads integers as numbers (a token above 2^53 rounded) unless the connection was
  // made with `stringNumbers`: a command that needs them exact goes through a twin of the
  // user's cluster client made so, at first use, ended with it (or by `rlock.close()`)
  let twin: IoRedisCluster | null = null;
  const exact = (): IoRedisCluster => {
    if (twin === null) {
      const t = c.duplicate([], { redisOptions: { ...(c.options.redisOptions ?? {}), stringNumbers: true } });
      t.on('error', () => {});
      const end = (): void => {
        c.off?.('end', end);
        t.disconnect();
        if (twin === t) twin = null;
      };
      c.on('end', end);
      twin = t;
    }
    return twin;
  };
  return {
    async send(key, args, options) {
      const [cmd, ...rest] = args;
      const cl = options?.exactNumbers ? exact() : c;
      // ioredis finds no key in a module's command: the slot is set on the command it makes,
      // so it goes to the key's node and follows MOVED / ASK as for any keyed command
      const slot = key === undefined ? undefined : slotOf(key);
      const routed = Object.create(cl) as IoRedisCluster;
      routed.sendCommand = (command: unknown, stream?: unknown, node?: unknown) => {
        if (slot !== undefined) (command as { slot?: number }).slot = slot;
        return cl.sendCommand(command, stream, node);
      };
      try {
        if (options?.buffers) return await routed.callBuffer(String(cmd), ...rest);
        return await routed.call(String(cmd), ...rest);
      } catch (e) {
        throw normalize(e);
      }
    },
    async dialSlot(slot, options) {
      const address = c.slots[slot]?.[0];
      if (address === undefined) throw new Error(`no master serves slot ${slot}`);
      return this.dialAddress(address, options);
    },
    async dialAddress(address, options) {
      const inst = c.connectionPool.getInstanceByKey(address);
      if (inst !== undefined) return dialIoRedis(inst, undefined, options);
      return dialIoRedis(anyNode(), hostPort(address), options);
    },
    refresh() {
      try {
        c.refreshSlotsCache(() => {});
      } catch {
        // ended
      }
    },
    onDeath(listener) {
      return listen(c, ['end'], listener);
    },
    async dispose() {
      twin?.disconnect();
      twin = null;
    },
  };
}

/** node-redis v5 `createSentinel()`: commands to the master it knows; a wait's connection a
 * duplicate of a client of that master. */
interface NodeRedisSentinel {
  sendCommand(isReadonly: boolean | undefined, args: Arg[], options?: object): Promise<unknown>;
  _execute<T>(isReadonly: boolean | undefined, fn: (client: NodeRedisClient) => Promise<T>): Promise<T>;
  getMasterNode(): unknown;
  on(event: string, listener: (...args: unknown[]) => void): unknown;
  off?(event: string, listener: (...args: unknown[]) => void): unknown;
}

class NodeRedisSentinelConnection implements Connection {
  constructor(private readonly c: NodeRedisSentinel) {}

  async send(args: readonly Arg[], options?: SendOptions): Promise<unknown> {
    try {
      return await this.c.sendCommand(false, [...args], typeMapping(options));
    } catch (e) {
      throw normalize(e);
    }
  }

  duplicate(): Promise<Connection> {
    return this.c._execute(false, (client) => dialNodeRedis(client));
  }

  poolKey(key?: Arg, options?: SendOptions): string {
    return serverPoolKey(key, options);
  }

  async close(): Promise<void> {}

  onDeath(listener: (err: Error) => void): () => void {
    return listen(this.c, ['end'], listener);
  }
}

/** The {@link Connection} of a cluster or sentinel client of either driver; null for another. */
export function adaptTopology(client: object): Connection | null {
  const c = client as Record<string, unknown>;
  if (c.isCluster === true && typeof c.call === 'function' && typeof c.refreshSlotsCache === 'function') {
    return new ClusterConnection(ioRedisCluster(client as unknown as IoRedisCluster));
  }
  if (typeof c.sendCommand === 'function' && typeof c.nodeClient === 'function' && 'masters' in c) {
    return new ClusterConnection(nodeRedisCluster(client as unknown as NodeRedisCluster));
  }
  if (typeof c.sendCommand === 'function' && typeof c.getMasterNode === 'function' && typeof c._execute === 'function') {
    return new NodeRedisSentinelConnection(client as unknown as NodeRedisSentinel);
  }
  return null;
}
