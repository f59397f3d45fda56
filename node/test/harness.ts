/**
 * Real servers for the tests: `redis-server` on a free port and a temp dir, with the rlock module
 * (`RLOCK_MODULE`), killed at the end (also on failure); its log printed when a test fails.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createClient } from 'redis';
import { Redis } from 'ioredis';

export const MODULE = process.env.RLOCK_MODULE ?? '';

// A file whose tests are done but whose process stays alive (a wait a failed test left retrying)
// ends 10 s later, with its exit code: one hung file must not hang the run (node --test waits
// for each file's process; --test-force-exit would also cut the summary reporter's last line).
after(() => {
  setTimeout(() => process.exit(), 10_000).unref();
});

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      const port = typeof a === 'object' && a !== null ? a.port : 0;
      s.close(() => resolve(port));
    });
  });
}

export function ping(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(port, '127.0.0.1');
    let buf = '';
    const done = (ok: boolean): void => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(500, () => done(false));
    sock.on('error', () => done(false));
    sock.on('connect', () => sock.write('PING\r\n'));
    sock.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\r\n')) done(buf.startsWith('+PONG'));
    });
  });
}

/** Kills `p` (SIGKILL) unless it has exited, and waits for its exit. */
export async function kill(p: ChildProcess | null): Promise<void> {
  if (p !== null && p.exitCode === null && p.signalCode === null) {
    const exited = new Promise((r) => p.once('exit', r));
    p.kill('SIGKILL');
    await exited;
  }
}

/** Polls `cond` every 10 ms until true; throws after `ms`. */
export async function until(cond: () => boolean | Promise<boolean>, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    if (await cond()) return;
    if (Date.now() >= end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export class Server {
  private proc: ChildProcess | null = null;
  readonly dir = mkdtempSync(join(tmpdir(), 'rlock-node-'));
  port = 0;

  /** `extra`: more arguments of `redis-server` (a cluster node's, a replica's). */
  constructor(private readonly extra: readonly string[] = []) {}

  get logPath(): string {
    return join(this.dir, 'server.log');
  }

  /** Starts the server: on a free port the first time, on the same port (and dir) after `crash()`. */
  async start(): Promise<void> {
    if (!MODULE || !existsSync(MODULE)) throw new Error('set RLOCK_MODULE to the built module (librlock.so)');
    if (this.port === 0) this.port = await freePort();
    const args = ['--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir, '--loadmodule', MODULE,
      '--save', '', '--appendonly', 'no', '--logfile', this.logPath, ...this.extra];
    this.proc = spawn(process.env.REDIS_SERVER ?? 'redis-server', args, { stdio: 'ignore' });
    const exited = new Promise<void>((resolve) => this.proc?.once('exit', () => resolve()));
    let gone = false;
    void exited.then(() => (gone = true));
    await until(async () => gone || (await ping(this.port)), 10000, 'the server to answer PING');
    if (gone) throw new Error(`the server exited at start:\n${this.log()}`);
  }

  /** Pauses (SIGSTOP) or resumes (SIGCONT) the server process. */
  signal(sig: 'SIGSTOP' | 'SIGCONT'): void {
    this.proc?.kill(sig);
  }

  /** Kills the server (SIGKILL: nothing saved at exit) and waits for its exit; `start()` brings
   * it back on the same port and dir, with what its persistence (if any) wrote. */
  async crash(): Promise<void> {
    const p = this.proc;
    this.proc = null;
    await kill(p);
  }

  log(): string {
    try {
      return readFileSync(this.logPath, 'utf8');
    } catch {
      return '(no log)';
    }
  }

  async stop(): Promise<void> {
    const p = this.proc;
    this.proc = null;
    await kill(p);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export interface Driver {
  name: string;
  /** A connected client of the driver, and how to close it. */
  connect(port: number): Promise<{ client: unknown; close(): Promise<void> }>;
  /** The same, made from a `redis://` URL. */
  connectUrl(url: string): Promise<{ client: unknown; close(): Promise<void> }>;
}

export const drivers: Driver[] = [
  {
    name: 'node-redis',
    async connect(port) {
      const c = createClient({ socket: { host: '127.0.0.1', port } });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: async () => void c.destroy() };
    },
    async connectUrl(url) {
      const c = createClient({ url });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: async () => void c.destroy() };
    },
  },
  {
    name: 'ioredis',
    async connect(port) {
      const c = new Redis({ host: '127.0.0.1', port, lazyConnect: true });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: async () => void c.disconnect() };
    },
    async connectUrl(url) {
      const c = new Redis(url, { lazyConnect: true });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: async () => void c.disconnect() };
    },
  },
];

export type Admin = ReturnType<typeof createClient>;

export interface Ctx {
  server: Server;
  /** A plain client for looking at the server (node-redis). */
  admin: Admin;
  /** A connected client of the driver under test (closed at the end of the file). */
  client(): Promise<unknown>;
  /** The same, made from the server's `redis://` URL. */
  urlClient(): Promise<unknown>;
}

/**
 * One server per test file: `suite('lock', (ctx, driver) => { test(...) })` runs the tests once
 * per driver. A failing test prints the server's log.
 */
export type TestFn = (name: string, fn: () => Promise<void>, options?: { skip?: string | false }) => void;

export function suite(title: string, body: (ctx: Ctx, test: TestFn, driver: Driver) => void): void {
  for (const driver of drivers) {
    describe(`${title} (${driver.name})`, () => {
      const server = new Server();
      const closers: (() => Promise<void>)[] = [];
      const ctx: Ctx = {
        server,
        admin: undefined as unknown as Admin,
        async client() {
          const c = await driver.connect(server.port);
          closers.push(c.close);
          return c.client;
        },
        async urlClient() {
          const c = await driver.connectUrl(`redis://127.0.0.1:${server.port}`);
          closers.push(c.close);
          return c.client;
        },
      };
      before(async () => {
        await server.start();
        ctx.admin = createClient({ socket: { host: '127.0.0.1', port: server.port } });
        ctx.admin.on('error', () => {});
        await ctx.admin.connect();
      });
      after(async () => {
        for (const c of closers.splice(0)) await c().catch(() => {});
        if (ctx.admin?.isOpen) ctx.admin.destroy();
        await server.stop();
      });
      const test: TestFn = (name, fn, options) => {
        it(name, { skip: options?.skip ?? false }, async () => {
          try {
            await fn();
          } catch (e) {
            process.stderr.write(`\n--- server log (${title}, ${driver.name}: ${name}) ---\n${server.log()}\n---\n`);
            throw e;
          }
        });
      };
      body(ctx, test, driver);
    });
  }
}

/** How many times the server ran `cmd` (INFO commandstats), e.g. `rlock.acquire`. */
export async function calls(admin: Admin, cmd: string): Promise<number> {
  const info = await admin.info('commandstats');
  const m = new RegExp(`cmdstat_${cmd.replace('.', '\\.')}:calls=(\\d+)`).exec(info);
  return m ? Number(m[1]) : 0;
}

/** Whether nobody holds the lock `name` (RLOCK.INFO nil and no hash). */
export async function free(admin: Admin, name: string): Promise<boolean> {
  const info = await admin.sendCommand(['RLOCK.INFO', name]);
  const exists = await admin.exists(name);
  return info === null && exists === 0;
}

/** The lock's hash (owner -> count) as a plain object. */
export async function hash(admin: Admin, name: string): Promise<Record<string, string>> {
  return { ...(await admin.hGetAll(name)) };
}

/** A small seeded generator (mulberry32): the randomized test prints its seed. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** How many waiters the lock `name` has (RLOCK.INFO's waiter count; 0 when free). */
export async function waiters(admin: Admin, name: string): Promise<number> {
  const info = (await admin.sendCommand(['RLOCK.INFO', name])) as unknown[] | null;
  return info === null ? 0 : Number(info[7]);
}

/** One contender of {@link randomAborts}: the party it acts for (holds of one party may overlap:
 * re-entries) and its one acquire. */
export interface Contender {
  party: string;
  tryAcquire(options: { waitMs?: number; leaseMs?: number; signal: AbortSignal }): Promise<{ release(): Promise<void> } | null>;
}

/**
 * Rounds of contenders for the lock `key`, each starting, waiting, holding and being aborted at
 * random times (seeded: `RLOCK_SEED` replays a run; the seed is printed on failure). Checks that
 * no two parties hold at once, and after each round that the lock is free and nobody waits; at
 * the end that some acquires were taken and some aborted. `round(r)` gives round `r`'s
 * contenders by index. Returns the counts.
 */
export async function randomAborts(
  admin: Admin,
  key: string,
  what: string,
  rounds: number,
  contenders: number,
  round: (r: number) => (i: number) => Contender,
): Promise<{ taken: number; aborted: number; reentered: number }> {
  const seed = Number(process.env.RLOCK_SEED ?? Math.floor(Math.random() * 2 ** 31));
  const rand = rng(seed);
  let taken = 0;
  let aborted = 0;
  let reentered = 0;
  try {
    for (let r = 0; r < rounds; r++) {
      const contender = round(r);
      const holding = new Map<string, number>();
      const tasks: Promise<void>[] = [];
      for (let i = 0; i < contenders; i++) {
        const c = contender(i);
        const ac = new AbortController();
        const abortAt = rand() * 30;
        const waitMs = rand() < 0.3 ? undefined : Math.floor(rand() * 40);
        const leaseMs = rand() < 0.5 ? undefined : 5000;
        const holdFor = rand() * 8;
        const startAt = rand() * 10;
        tasks.push(
          (async () => {
            await new Promise((res) => setTimeout(res, startAt));
            const timer = setTimeout(() => ac.abort(), abortAt);
            try {
              const hold = await c.tryAcquire({ waitMs, leaseMs, signal: ac.signal });
              if (hold === null) return;
              taken++;
              const mine = holding.get(c.party) ?? 0;
              if (mine > 0) reentered++;
              holding.set(c.party, mine + 1);
              const others = [...holding].filter(([id, n]) => id !== c.party && n > 0);
              assert.deepEqual(others, [], 'another party holds it at the same time');
              await new Promise((res) => setTimeout(res, holdFor));
              holding.set(c.party, holding.get(c.party)! - 1);
              await hold.release();
            } catch (e) {
              if ((e as Error).name !== 'AbortError') throw e;
              aborted++;
            } finally {
              clearTimeout(timer);
            }
          })(),
        );
      }
      await Promise.all(tasks);
      assert.ok(await free(admin, key), `round ${r}: the lock is free`);
      assert.equal(await waiters(admin, key), 0, `round ${r}: nobody waits`);
    }
    assert.ok(taken > 0 && aborted > 0, `some taken (${taken}), some aborted (${aborted}); re-entries ${reentered}`);
  } catch (e) {
    process.stderr.write(`${what}: seed ${seed} (RLOCK_SEED=${seed} replays it)\n`);
    throw e;
  }
  return { taken, aborted, reentered };
}
