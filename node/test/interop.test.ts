import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { RLock } from '../src/index.js';
import { free, suite, until } from './harness.js';

/** The Python package's sources in this repository (the tests run from build-test/test/). */
const PYTHON_SRC = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'python', 'src');

/** A Python process driving the Python package: one command a line, one answer a line. */
const DRIVER = `
import sys, redis
from redis_rlock import CountDownLatch, Lock, RWLock
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
objs = {}
def obj(kind, name):
    if (kind, name) not in objs:
        if kind == "lock":
            objs[(kind, name)] = Lock(r, name)
        else:
            rw = objs.setdefault(("rw", name), RWLock(r, name))
            objs[(kind, name)] = rw.read if kind == "read" else rw.write
    return objs[(kind, name)]
for line in sys.stdin:
    op, kind, name, *rest = line.split()
    if kind == "latch":
        latch = CountDownLatch(r, name)
        out = latch.count_down() if op == "countdown" else int(latch.wait(float(rest[0])))
        print(out, flush=True)
        continue
    o = obj(kind, name)
    if op == "try":
        out = o.acquire(blocking=False, lease=30)
    elif op == "wait":
        out = o.acquire(timeout=float(rest[0]), lease=30)
    else:
        o.release()
        out = "ok"
    print(int(out) if isinstance(out, bool) else out, flush=True)
`;

class Py {
  readonly #proc: ChildProcessWithoutNullStreams;
  readonly #lines: AsyncIterator<string>;
  #err = '';

  constructor(port: number) {
    this.#proc = spawn('python3', ['-c', DRIVER, String(port)], { env: { ...process.env, PYTHONPATH: PYTHON_SRC } });
    this.#proc.stderr.on('data', (d: Buffer) => (this.#err += d.toString()));
    this.#lines = createInterface({ input: this.#proc.stdout })[Symbol.asyncIterator]();
  }

  async ask(line: string): Promise<string> {
    this.#proc.stdin.write(`${line}\n`);
    const next = await this.#lines.next();
    if (next.done) throw new Error(`the Python process ended: ${this.#err}`);
    return next.value;
  }

  close(): void {
    this.#proc.kill('SIGKILL');
  }
}

const pythonReady = existsSync(join(PYTHON_SRC, 'redis_rlock')) && spawnSync('python3', ['-c', 'import redis'], { env: { ...process.env, PYTHONPATH: PYTHON_SRC } }).status === 0;

suite('interop', (ctx, test) => {
  test('a Node hold is Redisson\'s layout: redis-cli sees the owner\'s count and the lease, and is refused the lock', async () => {
    const rl = new RLock(await ctx.client());
    const hold = await rl.lock('i:cli').acquire({ leaseMs: 20000 });
    const cli = (...args: string[]): string => {
      const r = spawnSync('redis-cli', ['-p', String(ctx.server.port), '--no-raw', ...args], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      return r.stdout.trim();
    };
    assert.equal(cli('TYPE', 'i:cli'), 'hash');
    assert.equal(cli('HGET', 'i:cli', hold.owner), '"1"');
    const pttl = Number(/-?\d+/.exec(cli('PTTL', 'i:cli'))?.[0]);
    assert.ok(pttl > 15000 && pttl <= 20000, `pttl ${pttl}`);
    assert.match(cli('RLOCK.ACQUIRE', 'i:cli', 'someone-else', '1000'), /^\(integer\) \d+$/, 'busy for another owner');
    await hold.release();
    assert.equal(cli('EXISTS', 'i:cli'), '(integer) 0');
    assert.equal(cli('RLOCK.ACQUIRE', 'i:cli', 'someone-else', '1000'), '(nil)', 'free for another owner');
    await rl.close();
  });

  test('a lock held by the Python package blocks the Node client, and the reverse', async () => {
    assert.ok(pythonReady, 'python3 with redis-py, and the Python package in this repository, are needed');
    const rl = new RLock(await ctx.client());
    const py = new Py(ctx.server.port);
    try {
      assert.equal(await py.ask('try lock i:py'), '1');
      assert.equal(await rl.lock('i:py').tryAcquire(), null, 'Node finds it busy');
      const waiting = rl.lock('i:py').acquire({ waitMs: 10000, leaseMs: 10000 });
      await until(async () => Number(((await ctx.admin.sendCommand(['RLOCK.INFO', 'i:py'])) as unknown[])[7]) === 1, 5000, 'Node waits');
      assert.equal(await py.ask('release lock i:py'), 'ok');
      const hold = await waiting; // handed over by Python's release
      assert.equal(await py.ask('try lock i:py'), '0', 'Python finds it busy');
      const pyWaits = py.ask('wait lock i:py 10');
      await until(async () => Number(((await ctx.admin.sendCommand(['RLOCK.INFO', 'i:py'])) as unknown[])[7]) === 1, 5000, 'Python waits');
      await hold.release();
      assert.equal(await pyWaits, '1', 'Python got it after the Node release');
      assert.equal(await py.ask('release lock i:py'), 'ok');
      assert.ok(await free(ctx.admin, 'i:py'));
    } finally {
      py.close();
      await rl.close();
    }
  });

  test('read-write locks are shared with the Python package: readers share, a writer excludes', async () => {
    assert.ok(pythonReady, 'python3 with redis-py, and the Python package in this repository, are needed');
    const rl = new RLock(await ctx.client());
    const py = new Py(ctx.server.port);
    try {
      assert.equal(await py.ask('try read i:pyrw'), '1');
      const r = await rl.rwLock('i:pyrw').read.acquire({ waitMs: 0, leaseMs: 10000 });
      assert.equal(await rl.rwLock('i:pyrw').write.tryAcquire(), null);
      await r.release();
      assert.equal(await py.ask('release read i:pyrw'), 'ok');
      const w = await rl.rwLock('i:pyrw').write.acquire({ waitMs: 0, leaseMs: 10000 });
      assert.equal(await py.ask('try read i:pyrw'), '0', 'Python cannot read under a Node writer');
      await w.release();
      assert.equal(await py.ask('try write i:pyrw'), '1');
      assert.equal(await rl.rwLock('i:pyrw').read.tryAcquire(), null, 'Node cannot read under a Python writer');
      assert.equal(await py.ask('release write i:pyrw'), 'ok');
      assert.equal(await ctx.admin.exists('i:pyrw'), 0);
    } finally {
      py.close();
      await rl.close();
    }
  });

  test('a latch counted down by the Python package opens a Node await, and the reverse', async () => {
    assert.ok(pythonReady, 'python3 with redis-py, and the Python package in this repository, are needed');
    const rl = new RLock(await ctx.client());
    const py = new Py(ctx.server.port);
    try {
      const latch = rl.latch('i:latch');
      assert.equal(await latch.trySetCount(2), true);
      const nodeWaits = latch.await({ waitMs: 10000 });
      assert.equal(await py.ask('countdown latch i:latch'), '1');
      assert.equal(await py.ask('wait latch i:latch 0.05'), '0', 'Python sees it still closed');
      const pyWaits = py.ask('wait latch i:latch 10');
      await until(async () => (String(await ctx.admin.sendCommand(['CLIENT', 'LIST'])).match(/cmd=rlatch\.await/g) ?? []).length >= 2, 5000, 'both awaiters in the server');
      assert.equal(await latch.countDown(), 0);
      assert.equal(await nodeWaits, true);
      assert.equal(await pyWaits, '1', 'Python\'s wait opened by the Node count-down');
    } finally {
      py.close();
      await rl.close();
    }
  });
});
