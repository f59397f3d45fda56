/**
 * Real topologies for the tests: a 3-master Redis Cluster (each node a `Server` in cluster mode
 * with the module, slots assigned in thirds) and a master with a replica watched by a sentinel.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createClient } from 'redis';
import { freePort, kill, ping, Server, until } from './harness.js';

type Plain = ReturnType<typeof createClient>;

async function plain(port: number): Promise<Plain> {
  const c = createClient({ socket: { host: '127.0.0.1', port, reconnectStrategy: false } });
  c.on('error', () => {});
  await c.connect();
  return c;
}

/** Sends `args` to the server at `port` on a fresh connection. */
export async function on(port: number, args: string[]): Promise<unknown> {
  const c = await plain(port);
  try {
    return await c.sendCommand(args);
  } finally {
    c.destroy();
  }
}

/** Replicas of the master at `port` that have every write made so far (a write of its own, then
 * `WAIT` on that connection: the stream is ordered; a `WAIT` on a fresh connection proves nothing). */
export async function replicated(port: number): Promise<number> {
  const c = await plain(port);
  try {
    await c.sendCommand(['SET', 'test:replication-fence', String(Date.now())]);
    return Number(await c.sendCommand(['WAIT', '1', '3000']));
  } finally {
    c.destroy();
  }
}

export class ClusterNodes {
  readonly nodes: Server[] = [];
  readonly ids: string[] = [];

  async start(n = 3): Promise<void> {
    for (let i = 0; i < n; i++) {
      const s = new Server(['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '2000']);
      this.nodes.push(s);
      await s.start();
    }
    const per = Math.ceil(16384 / n);
    for (let i = 0; i < n; i++) {
      const [from, to] = [i * per, Math.min(16383, (i + 1) * per - 1)];
      await on(this.nodes[i]!.port, ['CLUSTER', 'ADDSLOTSRANGE', String(from), String(to)]);
      this.ids.push(String(await on(this.nodes[i]!.port, ['CLUSTER', 'MYID'])));
    }
    for (let i = 1; i < n; i++) await on(this.nodes[0]!.port, ['CLUSTER', 'MEET', '127.0.0.1', String(this.nodes[i]!.port)]);
    await until(async () => {
      for (const s of this.nodes) {
        const info = String(await on(s.port, ['CLUSTER', 'INFO']));
        if (!info.includes('cluster_state:ok') || !info.includes(`cluster_known_nodes:${n}`)) return false;
      }
      return true;
    }, 20000, 'the cluster to be ok on every node');
  }

  /** The index of the node serving `slot`. */
  owner(slot: number): number {
    const per = Math.ceil(16384 / this.nodes.length);
    return Math.floor(slot / per);
  }

  log(): string {
    return this.nodes.map((s, i) => `--- node ${i} (${s.port}) ---\n${s.log()}`).join('\n');
  }

  async stop(): Promise<void> {
    for (const s of this.nodes) await s.stop();
  }
}

/** A master, its replica and one sentinel watching them (`down-after` `downAfterMs`). */
export class SentinelSet {
  // a full sync (an old master rejoining after a pause) starts at once
  readonly master = new Server(['--repl-diskless-sync-delay', '0']);
  readonly replica = new Server(['--repl-diskless-sync-delay', '0']);
  readonly dir = mkdtempSync(join(tmpdir(), 'rlock-sentinel-'));
  sentinelPort = 0;
  private proc: ChildProcess | null = null;

  constructor(readonly name = 'rlockmaster', readonly downAfterMs = 1000) {}

  async start(): Promise<void> {
    await this.master.start();
    await this.replica.start();
    await on(this.replica.port, ['REPLICAOF', '127.0.0.1', String(this.master.port)]);
    await this.synced(this.replica.port);
    this.sentinelPort = await freePort();
    const conf = join(this.dir, 'sentinel.conf');
    writeFileSync(conf, [
      `port ${this.sentinelPort}`,
      'bind 127.0.0.1',
      `dir ${this.dir}`,
      `logfile ${join(this.dir, 'sentinel.log')}`,
      `sentinel monitor ${this.name} 127.0.0.1 ${this.master.port} 1`,
      `sentinel down-after-milliseconds ${this.name} ${this.downAfterMs}`,
      `sentinel failover-timeout ${this.name} 10000`,
      `sentinel parallel-syncs ${this.name} 1`,
      '',
    ].join('\n'));
    this.proc = spawn(process.env.REDIS_SERVER ?? 'redis-server', [conf, '--sentinel'], { stdio: 'ignore' });
    await until(() => ping(this.sentinelPort), 10000, 'the sentinel to answer PING');
    await until(async () => {
      const r = (await on(this.sentinelPort, ['SENTINEL', 'REPLICAS', this.name])) as unknown[];
      return r.length === 1;
    }, 10000, 'the sentinel to know the replica');
  }

  /** Whether the server at `port` is a replica in sync with its master. */
  async synced(port: number): Promise<void> {
    await until(async () => String(await on(port, ['INFO', 'replication'])).includes('master_link_status:up'), 10000, 'the replica in sync');
  }

  /** The port of the master the sentinel names now. */
  async masterPort(): Promise<number> {
    const r = (await on(this.sentinelPort, ['SENTINEL', 'GET-MASTER-ADDR-BY-NAME', this.name])) as string[];
    return Number(r[1]);
  }

  log(): string {
    let s = '';
    try {
      s = readFileSync(join(this.dir, 'sentinel.log'), 'utf8');
    } catch {
      s = '(no log)';
    }
    return `--- master (${this.master.port}) ---\n${this.master.log()}\n--- replica (${this.replica.port}) ---\n${this.replica.log()}\n--- sentinel ---\n${s}`;
  }

  async stop(): Promise<void> {
    const p = this.proc;
    this.proc = null;
    await kill(p);
    this.master.signal('SIGCONT');
    await this.master.stop();
    await this.replica.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
