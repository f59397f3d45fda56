// Hand-offs of one lock between N contenders (1, 8, 64), each looping acquire -> hold -> release,
// for rlock (waits in the server), redis-semaphore's Mutex (polls) and redlock (retries), the
// contenders as async tasks of one process (each on its own ioredis connection) and as
// processes: acquires/s, hand-offs/s, p50 / p99 of the wait for the lock and the idlest
// contender's share of the grants (of a fair share: 100% is fair). One redis-server with the
// module, on a free port in a temp dir. Build first (npm run build); RLOCK_MODULE set.
//
// BENCH_SECONDS (default 2), BENCH_CONTENDERS (1,8,64), BENCH_HOLD_MS (0,10), BENCH_MODES
// (tasks,processes), BENCH_CLIENTS (rlock,redis-semaphore,redlock).
import { fork, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { Mutex } from 'redis-semaphore';
import Redlock from 'redlock';
import { RLock } from '../dist/esm/index.js';

const list = (v, d) => (v ?? d).split(',').filter(Boolean);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 2);
const WARMUP_MS = 300;

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

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A contender's connection, ready (connected). */
async function connect(port) {
  const c = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
  await c.ping();
  return c;
}

/** One contender `id` on `c` looping on `name` until `end` (epoch ms): its grants as [at, id,
 * wait] measured from `start` (epoch ms; the warm-up before it is not counted). */
async function contend(c, implName, name, id, holdMs, start, end) {
  const take = impls[implName](c, name);
  const grants = [];
  while (Date.now() < end) {
    const t0 = performance.now();
    const release = await take();
    const at = Date.now();
    if (at >= start && at < end) grants.push([performance.timeOrigin + performance.now(), id, performance.now() - t0]);
    if (holdMs > 0) await sleep(holdMs);
    await release();
  }
  c.disconnect();
  return grants;
}

if (process.env.BENCH_CHILD) {
  // a contender process: connects, says ready, runs when told, sends its grants back
  process.once('message', async (m) => {
    const c = await connect(m.port);
    process.send('ready');
    process.once('message', async ({ start, end }) => {
      const grants = await contend(c, m.implName, m.name, m.id, m.holdMs, start, end);
      process.send(grants, () => process.exit(0));
    });
  });
} else {
  await main();
}

async function main() {
  const CONTENDERS = list(process.env.BENCH_CONTENDERS, '1,8,64').map(Number);
  const HOLDS = list(process.env.BENCH_HOLD_MS, '0,10').map(Number);
  const MODES = list(process.env.BENCH_MODES, 'tasks,processes');
  const CLIENTS = list(process.env.BENCH_CLIENTS, Object.keys(impls).join(','));
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
  const server = spawn(process.env.REDIS_SERVER ?? 'redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no', '--maxclients', '2000', '--loadmodule', MODULE], { stdio: 'ignore' });
  process.on('exit', () => server.kill('SIGKILL'));
  const admin = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: null, lazyConnect: true });
  admin.on('error', () => {}); // refused until the server listens
  for (let i = 0; ; i++) {
    if ((await admin.ping().catch(() => '')) === 'PONG') break;
    if (i > 400) throw new Error('the server did not start');
    await sleep(25);
  }

  const pct = (xs, p) => (xs.length === 0 ? NaN : xs[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]);
  console.log('| contenders | as | held ms | client | acquires/s | hand-offs/s | p50 wait ms | p99 wait ms | idlest share |');
  console.log('|---|---|---|---|---|---|---|---|---|');
  let round = 0;
  for (const holdMs of HOLDS) {
    for (const mode of MODES) {
      for (const n of CONTENDERS) {
        if (mode === 'processes' && n === 1) continue; // the same as one task
        for (const implName of CLIENTS) {
          const name = `bench:${implName}:${n}:${mode}:${holdMs}:${round++}`;
          let runs;
          let go;
          if (mode === 'tasks') {
            const conns = await Promise.all(Array.from({ length: n }, () => connect(port)));
            go = (start, end) => conns.map((c, id) => contend(c, implName, name, id, holdMs, start, end));
          } else {
            const children = await Promise.all(Array.from({ length: n }, (_, id) => new Promise((resolve, reject) => {
              const child = fork(fileURLToPath(import.meta.url), [], { env: { ...process.env, BENCH_CHILD: '1' } });
              child.once('message', () => resolve(child)); // ready
              child.once('error', reject);
              child.send({ port, implName, name, id, holdMs });
            })));
            go = (start, end) => children.map((child) => new Promise((resolve, reject) => {
              child.once('message', resolve);
              child.once('exit', (code) => (code === 0 ? undefined : reject(new Error(`contender exited ${code}`))));
              child.send({ start, end });
            }));
          }
          const start = Date.now() + WARMUP_MS;
          runs = go(start, start + SECONDS * 1000);
          const grants = (await Promise.all(runs)).flat().sort((a, b) => a[0] - b[0]);
          const per = new Array(n).fill(0);
          let handoffs = 0;
          for (let i = 0; i < grants.length; i++) {
            per[grants[i][1]]++;
            // a hand-off: the lock taken by another contender than the one that held it last (a
            // polling client's holder often takes it again at once)
            if (i > 0 && grants[i][1] !== grants[i - 1][1]) handoffs++;
          }
          const waits = grants.map((g) => g[2]).sort((a, b) => a - b);
          const fair = grants.length / n;
          const idlest = fair === 0 ? 0 : Math.min(...per) / fair;
          console.log(`| ${n} | ${mode} | ${holdMs} | ${implName} | ${Math.round(grants.length / SECONDS)} | ${Math.round(handoffs / SECONDS)} | ${pct(waits, 50).toFixed(2)} | ${pct(waits, 99).toFixed(2)} | ${n === 1 ? '-' : `${Math.round(idlest * 100)}%`} |`);
        }
      }
    }
  }
  admin.disconnect();
  server.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
}
