/**
 * Real servers for the tests: `redis-server` on a free port and a temp dir, with the rlock module
 * (`RLOCK_MODULE`), killed at the end (also on failure); its log printed when a test fails.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createClient } from 'redis';
import { Redis } from 'ioredis';

export const MODULE = process.env.RLOCK_MODULE ?? '';

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
