// Hand-offs of one lock between N contenders (1, 8, 64), each looping acquire -> hold -> release,
// for rlock (waits in the server), redis-semaphore's Mutex (polls) and redlock (retries), the
// contenders as async tasks of one process (each on its own ioredis connection) and as
// processes: acquires/s, hand-offs/s, p50 / p99 of the wait for the lock and the idlest
// contender's share of the grants (of a fair share: 100% is fair). One redis-server with the
// module, on a free port in a temp dir. Build first (npm run build); RLOCK_MODULE set.
//
// BENCH_SECONDS (default 2), BENCH_CONTENDERS (1,8,64), BENCH_HOLD_MS (0,10), BENCH_MODES
// (tasks,processes), BENCH_CLIENTS (rlock,redis-semaphore,redlock). Then the uncontended
// acquire + release, the clients alternating block by block. `--out FILE` writes the section
// between `<!-- node` and `<!-- /node -->` of FILE (BENCHMARKS.md) with the targets checked.
import { fork, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
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

/** One contender `id` on `c` looping on `name` until `end` (epoch ms): its grants in
 * [start, end) as [at, id], and its waits, each the part of it within [start, end) (a
 * contender starved the whole row counts one wait of the whole row). */
async function contend(c, implName, name, id, holdMs, start, end) {
  const take = impls[implName](c, name);
  const grants = [];
  const waits = [];
  const epoch = () => performance.timeOrigin + performance.now();
  while (Date.now() < end) {
    const t0 = epoch();
    const release = await take();
    const at = epoch();
    if (at >= start && at < end) grants.push([at, id]);
    if (at > start && t0 < end) waits.push(Math.min(at, end) - Math.max(t0, start));
    if (holdMs > 0) await sleep(holdMs);
    await release();
  }
  c.disconnect();
  return { grants, waits };
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
  const out = [];
  const say = (line) => {
    console.log(line);
    out.push(line);
  };
  const rows = [];
  say('| contenders | as | held ms | client | acquires/s | hand-offs/s | p50 wait ms | p99 wait ms | idlest share |');
  say('|---|---|---|---|---|---|---|---|---|');
  let round = 0;
  for (const holdMs of HOLDS) {
    for (const mode of MODES) {
      for (const n of CONTENDERS) {
        if (mode === 'processes' && n === 1) continue; // the same as one task
        for (const implName of CLIENTS) {
          const name = `bench:${implName}:${n}:${mode}:${holdMs}:${round++}`;
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
          const results = await Promise.all(go(start, start + SECONDS * 1000));
          const grants = results.flatMap((r) => r.grants).sort((a, b) => a[0] - b[0]);
          const per = new Array(n).fill(0);
          let handoffs = 0;
          for (let i = 0; i < grants.length; i++) {
            per[grants[i][1]]++;
            // a hand-off: the lock taken by another contender than the one that held it last (a
            // polling client's holder often takes it again at once)
            if (i > 0 && grants[i][1] !== grants[i - 1][1]) handoffs++;
          }
          const waits = results.flatMap((r) => r.waits).sort((a, b) => a - b);
          const fair = grants.length / n;
          const row = {
            n, mode, holdMs, implName,
            acquires: grants.length / SECONDS,
            handoffs: handoffs / SECONDS,
            p50: pct(waits, 50),
            p99: pct(waits, 99),
            idlest: fair === 0 ? 0 : Math.min(...per) / fair,
          };
          rows.push(row);
          say(`| ${n} | ${mode} | ${holdMs} | ${implName} | ${Math.round(row.acquires)} | ${Math.round(row.handoffs)} | ${row.p50.toFixed(2)} | ${row.p99.toFixed(2)} | ${n === 1 ? '-' : `${Math.round(row.idlest * 100)}%`} |`);
        }
      }
    }
  }

  // uncontended: one connection, a lock nobody else uses, blocks of 50 acquire + release, the
  // clients alternating block by block: the median block, and the median of the per-block
  // ratios to redis-semaphore's (neighbouring blocks, which the machine's slow moments hit alike)
  const BLOCK = 50;
  const BLOCKS = Number(process.env.BENCH_BLOCKS ?? 60);
  const uc = await connect(port);
  const takes = Object.fromEntries(CLIENTS.map((k) => [k, impls[k](uc, `bench:uncontended:${k}`)]));
  const blocks = Object.fromEntries(CLIENTS.map((k) => [k, []]));
  for (let b = -5; b < BLOCKS; b++) {
    for (const k of CLIENTS) {
      const t0 = performance.now();
      for (let i = 0; i < BLOCK; i++) await (await takes[k]())();
      if (b >= 0) blocks[k].push(((performance.now() - t0) * 1000) / BLOCK);
    }
  }
  uc.disconnect();
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const base = 'redis-semaphore';
  const uncontended = {};
  say('');
  say(`| client | µs per acquire+release | vs ${base} |`);
  say('|---|---|---|');
  for (const k of CLIENTS) {
    const ratio = blocks[base] ? median(blocks[k].map((v, i) => v / blocks[base][i])) : NaN;
    uncontended[k] = { us: median(blocks[k]), ratio };
    say(`| ${k} | ${Math.round(uncontended[k].us)} | ${ratio.toFixed(2)}x |`);
  }

  const outIdx = process.argv.indexOf('--out');
  if (outIdx !== -1) writeSection(process.argv[outIdx + 1], rows, out, uncontended);
  admin.disconnect();
  server.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
}

/** BENCHMARKS.md's Node section: the targets, then the tables of this run. */
function writeSection(file, rows, tables, uncontended) {
  const find = (n, mode, holdMs, implName) => rows.find((r) => r.n === n && r.mode === mode && r.holdMs === holdMs && r.implName === implName);
  const targets = [];
  const fmt = (x) => (!Number.isFinite(x) ? 'theirs 0' : x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));
  for (const holdMs of [0, 10]) {
    for (const mode of ['tasks', 'processes']) {
      const r = find(8, mode, holdMs, 'rlock');
      if (!r) continue;
      for (const other of ['redis-semaphore', 'redlock']) {
        const o = find(8, mode, holdMs, other);
        if (!o) continue;
        const h = r.handoffs / o.handoffs;
        targets.push(`| hand-offs/s / ${other}'s, 8 ${mode}, ${holdMs} ms held | ${fmt(h)} | ≥ 10 | ${h >= 10 ? 'yes' : '**no**'} |`);
        const p = r.p99 / o.p99;
        targets.push(`| p99 wait / ${other}'s, 8 ${mode}, ${holdMs} ms held | ${fmt(p)} | ≤ 0.10 | ${p <= 0.1 ? 'yes' : '**no**'} |`);
      }
    }
  }
  const many = rows.filter((r) => r.implName === 'rlock' && r.n > 1);
  if (many.length > 0) {
    const idlest = Math.min(...many.map((r) => r.idlest));
    targets.push(`| idlest contender's share of a fair share, every rlock row with N > 1 | ${Math.round(idlest * 100)}% | > 0 (none starved) | ${idlest > 0 ? 'yes' : '**no**'} |`);
  }
  if (uncontended.rlock && Number.isFinite(uncontended.rlock.ratio)) {
    const u = uncontended.rlock.ratio;
    targets.push(`| uncontended acquire+release / redis-semaphore's | ${u.toFixed(2)} | ≤ 1.20 | ${u <= 1.2 ? 'yes' : '**no**'} |`);
  }
  let rev = '';
  try {
    rev = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    rev = 'unknown';
  }
  const pkg = (name) => {
    try {
      return JSON.parse(readFileSync(new URL(`../node_modules/${name}/package.json`, import.meta.url), 'utf8')).version;
    } catch {
      return '?';
    }
  };
  const section = [
    '<!-- node: written by `make bench-node` (node/bench/handoff.mjs) -->',
    '## Node.js',
    '',
    `What Node.js users run today against the package (node/, redis-rlock), on ONE redis-server with the module, in one run of \`make bench-node\`: one lock handed between N contenders looping acquire -> hold (0 or 10 ms) -> release for ${SECONDS} s a row, as async tasks of one process (an ioredis connection each) and as N processes. redis-rlock waits in the server; redis-semaphore's \`Mutex\` polls every 10 ms; redlock retries every 10 ± 5 ms. The load generators and the server share 2 cores: absolute figures are noisy, only ratios in the same run mean anything.`,
    '',
    `- Node ${process.version}, ioredis ${pkg('ioredis')}, redis-semaphore ${pkg('redis-semaphore')}, redlock ${pkg('redlock')}, redis-rlock from this checkout (${rev})`,
    `- Date: ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC`,
    '',
    '### Targets',
    '',
    '| target | measured | limit | met |',
    '|---|---|---|---|',
    ...targets,
    '',
    'Reading the targets. At 0 ms held a polling client is hardly contended: the contender that releases takes the lock again at once while the others sleep out their poll, so most of its waits are near zero and its p99 is small; rlock hands the lock over FIFO at every release, so every grant is a hand-off and every wait is a turn in the queue (p99 about N hand-offs). As processes, each of rlock\'s hand-offs wakes another process on 2 cores shared by N processes and the server, which bounds its rate (the tasks rows, one process, show the same hand-offs at several times the rate). At 10 ms held at most about 100 grants a second are possible whoever holds; there the polling clients starve contenders (idlest share 0%, waits of the whole row) while rlock serves every contender in turn.',
    '',
    '### Contention and uncontended acquire + release',
    '',
    'acquires/s: every grant; hand-offs/s: grants to another contender than the last holder (a polling client\'s holder mostly takes the lock again at once); wait: from the call to acquire to the grant, the part of each wait within the row (a contender starved the whole row counts one wait of the whole row); idlest share: the idlest contender\'s grants against a fair share (100%: fair). Uncontended: one connection, blocks of 50 acquire+release, the clients alternating block by block: the median block and the median of the per-block ratios.',
    '',
    ...tables,
    '<!-- /node -->',
  ].join('\n');
  let text = readFileSync(file, 'utf8');
  const a = text.indexOf('<!-- node:');
  const b = text.indexOf('<!-- /node -->');
  if (a !== -1 && b > a) text = text.slice(0, a) + section + text.slice(b + '<!-- /node -->'.length);
  else text = `${text.replace(/\n*$/, '')}\n\n${section}\n`;
  writeFileSync(file, text);
}
