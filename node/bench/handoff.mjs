// Hand-offs of one lock between N contenders (1, 8, 64), each looping acquire -> release, for
// rlock (waits in the server), redis-semaphore's Mutex (polls) and redlock (retries): hand-offs
// per second and the p50 / p99 of the wait for the lock. One redis-server with the module, on a
// free port in a temp dir; ioredis for all three. Build first (npm run build); RLOCK_MODULE set.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { Mutex } from 'redis-semaphore';
import Redlock from 'redlock';
import { RLock } from '../dist/esm/index.js';

const SECONDS = Number(process.env.BENCH_SECONDS ?? 3);
const CONTENDERS = (process.env.BENCH_CONTENDERS ?? '1,8,64').split(',').map(Number);
const MODULE = process.env.RLOCK_MODULE;
if (!MODULE) throw new Error('set RLOCK_MODULE to the built module');

const port = await new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => {
    const p = s.address().port;
    s.close(() => resolve(p));
  });
});
const dir = mkdtempSync(join(tmpdir(), 'rlock-bench-'));
const server = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no', '--loadmodule', MODULE], { stdio: 'ignore' });
process.on('exit', () => server.kill('SIGKILL'));

const client = () => new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
const admin = client();
admin.on('error', () => {}); // refused until the server listens
for (let i = 0; i < 200; i++) {
  if ((await admin.ping().catch(() => '')) === 'PONG') break;
  await new Promise((r) => setTimeout(r, 25));
}

const impls = {
  rlock: (c, name) => {
    const lock = new RLock(c).lock(name);
    return async () => {
      const h = await lock.acquire({ leaseMs: 10000 });
      return () => h.release();
    };
  },
  'redis-semaphore': (c, name) => {
    const m = new Mutex(c, name, { lockTimeout: 10000, acquireTimeout: 60000, retryInterval: 10 });
    return async () => {
      await m.acquire();
      return () => m.release();
    };
  },
  redlock: (c, name) => {
    const rl = new Redlock([c], { retryCount: -1, retryDelay: 10, retryJitter: 5 });
    return async () => {
      const l = await rl.acquire([name], 10000);
      return () => l.release();
    };
  },
};

const pct = (xs, p) => (xs.length === 0 ? NaN : xs[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]);
// a hand-off: the lock taken by another contender than the one that held it last (a polling
// client's holder often takes it again at once); acquires: every grant
console.log('| contenders | client | acquires/s | hand-offs/s | p50 wait ms | p99 wait ms |');
console.log('|---|---|---|---|---|---|');
for (const n of CONTENDERS) {
  for (const [implName, make] of Object.entries(impls)) {
    const name = `bench:${implName}:${n}`;
    const clients = Array.from({ length: n }, client);
    const waits = [];
    let count = 0;
    let handoffs = 0;
    let last = -1;
    const end = performance.now() + SECONDS * 1000;
    await Promise.all(clients.map(async (c, i) => {
      const take = make(c, name);
      while (performance.now() < end) {
        const t0 = performance.now();
        const release = await take();
        waits.push(performance.now() - t0);
        count++;
        if (last !== -1 && last !== i) handoffs++;
        last = i;
        await release();
      }
    }));
    waits.sort((a, b) => a - b);
    console.log(`| ${n} | ${implName} | ${Math.round(count / SECONDS)} | ${Math.round(handoffs / SECONDS)} | ${pct(waits, 50).toFixed(2)} | ${pct(waits, 99).toFixed(2)} |`);
    for (const c of clients) c.disconnect();
  }
}
admin.disconnect();
server.kill('SIGKILL');
rmSync(dir, { recursive: true, force: true });
