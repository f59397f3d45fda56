import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { RLock, type Hold } from '../src/index.js';
import { free, suite, until, waiters, type Admin } from './harness.js';

/** The repository root (the tests run from node/build-test/test/). */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const TARGET = process.env.CARGO_TARGET_DIR ?? join(ROOT, 'target');
const CARGO = spawnSync('cargo', ['--version']).status === 0;
const NO_CARGO = CARGO ? false : 'cargo is not on PATH: the Rust crate\'s driver (client/examples/line_driver/main.rs) cannot be built';

let built: Promise<string> | undefined;

/** Builds the Rust crate's line driver once (release, the module's target dir): its path. */
function driverBinary(): Promise<string> {
  built ??= new Promise((ok, fail) => {
    const p = spawn('cargo', ['build', '--release', '--quiet', '-p', 'rlock-client', '--example', 'line_driver'], {
      cwd: ROOT,
      env: { ...process.env, CARGO_TARGET_DIR: TARGET },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    p.on('error', fail);
    p.on('exit', (code) => (code === 0 ? ok(join(TARGET, 'release', 'examples', 'line_driver')) : fail(new Error(`cargo build of line_driver failed:\n${err}`))));
  });
  return built;
}

/** A process of the Rust crate (its `line_driver` example): one command a line, one answer a line. */
class Rust {
  readonly #proc: ChildProcessWithoutNullStreams;
  readonly #lines: AsyncIterator<string>;
  #err = '';

  private constructor(bin: string, port: number) {
    this.#proc = spawn(bin, [`redis://127.0.0.1:${port}/`]);
    this.#proc.stderr.on('data', (d: Buffer) => (this.#err += d.toString()));
    this.#lines = createInterface({ input: this.#proc.stdout })[Symbol.asyncIterator]();
  }

  static async start(port: number): Promise<Rust> {
    return new Rust(await driverBinary(), port);
  }

  async ask(line: string): Promise<string> {
    this.#proc.stdin.write(`${line}\n`);
    const next = await this.#lines.next();
    if (next.done) throw new Error(`the Rust process ended: ${this.#err}`);
    return next.value;
  }

  close(): void {
    this.#proc.kill('SIGKILL');
  }
}

/** A fencing token the Rust driver answered (fails on `busy`, `timeout`, `error ...`). */
function token(answer: string): bigint {
  assert.match(answer, /^\d+$/, `a grant with a token, got "${answer}"`);
  return BigInt(answer);
}

/** Whether `p` has settled (after the turns of the event loop already due). */
async function settled(p: Promise<unknown>): Promise<boolean> {
  let done = false;
  p.then(() => (done = true), () => (done = true));
  await new Promise((r) => setImmediate(r));
  return done;
}

/** Readers and writers waiting for the read-write lock `name` (RWLOCK.INFO; 0 when free). */
async function rwWaiters(admin: Admin, name: string): Promise<number> {
  const r = (await admin.sendCommand(['RWLOCK.INFO', name])) as unknown[] | null;
  if (r === null) return 0;
  const o: Record<string, unknown> = {};
  for (let i = 0; i + 1 < r.length; i += 2) o[String(r[i])] = r[i + 1];
  return Number(o.waiting_readers) + Number(o.waiting_writers);
}

async function awaiters(admin: Admin): Promise<number> {
  return (String(await admin.sendCommand(['CLIENT', 'LIST'])).match(/cmd=rlatch\.await/g) ?? []).length;
}

suite('interop with the Rust crate', (ctx, test) => {
  test('a Node hold blocks the Rust crate\'s acquire and the reverse; fencing tokens grow across both', async () => {
    const rl = new RLock(await ctx.client());
    const rust = await Rust.start(ctx.server.port);
    try {
      const a = await rl.lock('r:mutual').acquire({ leaseMs: 20000 });
      assert.equal(await rust.ask('try lock r:mutual'), 'busy', 'Rust finds a Node hold busy');
      await a.release();
      const t2 = token(await rust.ask('try lock r:mutual'));
      assert.ok(t2 > a.token, `Rust's token ${t2} after Node's ${a.token}`);
      assert.equal(await rl.lock('r:mutual').tryAcquire(), null, 'Node finds a Rust hold busy');
      assert.equal(await rust.ask('release lock r:mutual'), 'ok');
      const b = await rl.lock('r:mutual').acquire({ waitMs: 0, leaseMs: 20000 });
      assert.ok(b.token > t2, `Node's token ${b.token} after Rust's ${t2}`);
      await b.release();
      assert.ok(await free(ctx.admin, 'r:mutual'));
    } finally {
      rust.close();
      await rl.close();
    }
  }, { skip: NO_CARGO });

  test('waiters of Node and of the Rust crate are served first come, first served, each release handing over to the next', async () => {
    const rl = new RLock(await ctx.client());
    const rust = await Rust.start(ctx.server.port);
    try {
      const a = await rl.lock('r:fifo').acquire({ leaseMs: 20000 });
      const rustWaits = rust.ask('wait lock r:fifo 10');
      await until(async () => (await waiters(ctx.admin, 'r:fifo')) === 1, 5000, 'Rust waits');
      const nodeWaits = rl.lock('r:fifo').acquire({ waitMs: 10000, leaseMs: 20000 });
      nodeWaits.catch(() => {});
      await until(async () => (await waiters(ctx.admin, 'r:fifo')) === 2, 5000, 'Node waits behind Rust');
      await a.release();
      const t2 = token(await rustWaits); // the first waiter, Rust, is handed the lock
      assert.ok(t2 > a.token);
      assert.equal(await waiters(ctx.admin, 'r:fifo'), 1, 'Node still queued');
      assert.equal(await settled(nodeWaits), false, 'Node is not served while Rust holds');
      assert.equal(await rust.ask('release lock r:fifo'), 'ok');
      const b: Hold = await nodeWaits; // handed over by Rust's release
      assert.ok(b.token > t2, `Node's token ${b.token} after Rust's ${t2}`);
      const rustAgain = rust.ask('wait lock r:fifo 10');
      await until(async () => (await waiters(ctx.admin, 'r:fifo')) === 1, 5000, 'Rust waits again');
      assert.equal(await rl.lock('r:fifo').tryAcquire(), null, 'a one-try does not jump the queue');
      await b.release();
      const t4 = token(await rustAgain);
      assert.ok(t4 > b.token);
      assert.equal(await rust.ask('release lock r:fifo'), 'ok');
      assert.ok(await free(ctx.admin, 'r:fifo'));
    } finally {
      rust.close();
      await rl.close();
    }
  }, { skip: NO_CARGO });

  test('read-write locks are shared with the Rust crate: readers share, a writer excludes and is handed over, write tokens grow', async () => {
    const rl = new RLock(await ctx.client());
    const rust = await Rust.start(ctx.server.port);
    try {
      assert.equal(await rust.ask('try read r:rw'), '-', 'a read hold carries no token');
      const r = await rl.rwLock('r:rw').read.acquire({ waitMs: 0, leaseMs: 20000 });
      assert.equal(await rl.rwLock('r:rw').write.tryAcquire(), null, 'Node cannot write under readers');
      assert.match(await rust.ask('wait write r:rw 1'), /^error upgrade refused/, 'Rust cannot upgrade its read hold');
      const nodeWrites = rl.rwLock('r:rw').write.acquire({ waitMs: 10000, leaseMs: 20000 });
      nodeWrites.catch(() => {});
      await until(async () => (await rwWaiters(ctx.admin, 'r:rw')) === 1, 5000, 'the Node writer waits');
      await r.release();
      assert.equal(await settled(nodeWrites), false, 'still a Rust reader');
      assert.equal(await rust.ask('release read r:rw'), 'ok');
      const w = await nodeWrites;
      assert.equal(await rust.ask('try read r:rw'), 'busy', 'Rust cannot read under a Node writer');
      const rustWrites = rust.ask('wait write r:rw 10');
      await until(async () => (await rwWaiters(ctx.admin, 'r:rw')) === 1, 5000, 'the Rust writer waits');
      await w.release();
      const t2 = token(await rustWrites);
      assert.ok(t2 > w.token, `Rust's write token ${t2} after Node's ${w.token}`);
      assert.equal(await rl.rwLock('r:rw').read.tryAcquire(), null, 'Node cannot read under a Rust writer');
      assert.equal(await rust.ask('release write r:rw'), 'ok');
      const w2 = await rl.rwLock('r:rw').write.acquire({ waitMs: 0, leaseMs: 20000 });
      assert.ok(w2.token > t2);
      await w2.release();
      assert.equal(await ctx.admin.exists('r:rw'), 0);
    } finally {
      rust.close();
      await rl.close();
    }
  }, { skip: NO_CARGO });

  test('a latch counted down by the Rust crate opens a Node await, and the reverse', async () => {
    const rl = new RLock(await ctx.client());
    const rust = await Rust.start(ctx.server.port);
    try {
      const latch = rl.latch('r:latch');
      assert.equal(await latch.trySetCount(2), true);
      const rustAwaits = rust.ask('await latch r:latch 10');
      await until(async () => (await awaiters(ctx.admin)) === 1, 5000, 'the Rust awaiter in the server');
      assert.equal(await latch.countDown(), 1);
      assert.equal(await settled(rustAwaits), false, 'one count left');
      assert.equal(await latch.countDown(), 0);
      assert.equal(await rustAwaits, '1', 'Rust\'s wait opened by the Node count-down');

      assert.equal(await rust.ask('trysetcount latch r:latch2 2'), '1');
      const nodeAwaits = rl.latch('r:latch2').await({ waitMs: 10000 });
      nodeAwaits.catch(() => {});
      await until(async () => (await awaiters(ctx.admin)) === 1, 5000, 'the Node awaiter in the server');
      assert.equal(await rust.ask('countdown latch r:latch2'), '1');
      assert.equal(await settled(nodeAwaits), false, 'one count left');
      assert.equal(await rust.ask('countdown latch r:latch2'), '0');
      assert.equal(await nodeAwaits, true, 'Node\'s await opened by the Rust count-down');
    } finally {
      rust.close();
      await rl.close();
    }
  }, { skip: NO_CARGO });
});
