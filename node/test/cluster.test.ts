import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Cluster } from 'ioredis';
import { createCluster } from 'redis';
import { LockTimeout, RLock } from '../src/index.js';
import { slotOf } from '../src/topology.js';
import { until } from './harness.js';
import { ClusterNodes, on } from './topology.js';

interface ClusterDriver {
  name: string;
  connect(port: number): Promise<{ client: unknown; close(): Promise<void> }>;
}

const clusterDrivers: ClusterDriver[] = [
  {
    name: 'node-redis',
    async connect(port) {
      const c = createCluster({ rootNodes: [{ socket: { host: '127.0.0.1', port } }] });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: async () => void c.destroy() };
    },
  },
  {
    name: 'ioredis',
    async connect(port) {
      const c = new Cluster([{ host: '127.0.0.1', port }], { lazyConnect: true });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: async () => void c.disconnect() };
    },
  },
];

/** A hash tag whose slot node `node` serves, other than those in `not`. */
function tagOn(cl: ClusterNodes, node: number, not: string[] = []): string {
  for (let i = 0; ; i++) {
    const tag = `{n${node}t${i}}`;
    if (cl.owner(slotOf(tag)) === node && !not.includes(tag)) return tag;
  }
}

async function info(port: number, name: string): Promise<unknown[] | null> {
  return (await on(port, ['RLOCK.INFO', name])) as unknown[] | null;
}

/** The index of the node serving `name` now (slots move in the tests): the one not answering MOVED. */
async function servedBy(cl: ClusterNodes, name: string, among = [0, 1, 2]): Promise<number> {
  for (const n of among) {
    const r = await on(cl.nodes[n]!.port, ['EXISTS', name]).catch((e: Error) => e);
    if (!(r instanceof Error)) return n;
  }
  throw new Error(`no node serves ${name}`);
}

/** A name on each of the nodes `among` (in that order), as they serve slots now. */
async function namesOn(cl: ClusterNodes, prefix: string, among = [0, 1, 2]): Promise<string[]> {
  const found = new Map<number, string>();
  for (let i = 0; found.size < among.length; i++) {
    const name = `{${prefix}${i}}:x`;
    const n = await servedBy(cl, name, among);
    if (!found.has(n)) found.set(n, name);
  }
  return among.map((n) => found.get(n)!);
}

/** Moves `slot` from node `from` to node `to` with its keys (as `redis-cli --cluster reshard`). */
async function migrate(cl: ClusterNodes, slot: number, from: number, to: number, finish = true): Promise<void> {
  const [a, b] = [cl.nodes[from]!, cl.nodes[to]!];
  await on(b.port, ['CLUSTER', 'SETSLOT', String(slot), 'IMPORTING', cl.ids[from]!]);
  await on(a.port, ['CLUSTER', 'SETSLOT', String(slot), 'MIGRATING', cl.ids[to]!]);
  const keys = (await on(a.port, ['CLUSTER', 'GETKEYSINSLOT', String(slot), '100'])) as string[];
  if (keys.length > 0) await on(a.port, ['MIGRATE', '127.0.0.1', String(b.port), '', '0', '5000', 'KEYS', ...keys]);
  if (finish) await finishMigration(cl, slot, to);
}

async function finishMigration(cl: ClusterNodes, slot: number, to: number): Promise<void> {
  for (const s of cl.nodes) await on(s.port, ['CLUSTER', 'SETSLOT', String(slot), 'NODE', cl.ids[to]!]);
}

for (const driver of clusterDrivers) {
  describe(`cluster (${driver.name})`, () => {
    const cl = new ClusterNodes();
    const closers: (() => Promise<void>)[] = [];
    const client = async (): Promise<unknown> => {
      const c = await driver.connect(cl.nodes[0]!.port);
      closers.push(c.close);
      return c.client;
    };
    before(() => cl.start());
    after(async () => {
      for (const c of closers.splice(0)) await c().catch(() => {});
      await cl.stop();
    });
    const test = (name: string, fn: () => Promise<void>): void => {
      it(name, async () => {
        try {
          await fn();
        } catch (e) {
          process.stderr.write(`\n--- cluster logs (${driver.name}: ${name}) ---\n${cl.log()}\n---\n`);
          throw e;
        }
      });
    };

    test('locks on every master: each held on the node serving its slot, a wait served there', async () => {
      const rl = new RLock(await client());
      for (let n = 0; n < 3; n++) {
        const name = `${tagOn(cl, n)}:lock`;
        const holder = await rl.lock(name).acquire({ leaseMs: 10000 });
        const node = cl.nodes[n]!;
        assert.equal((await info(node.port, name))?.[1], holder.owner);
        for (let m = 0; m < 3; m++) if (m !== n) assert.match(String(await on(cl.nodes[m]!.port, ['EXISTS', name]).catch((e: Error) => e.message)), /^MOVED /);
        const waiting = rl.lock(name).acquire({ waitMs: 5000, leaseMs: 10000 });
        // queued in the lock's node, on a connection of its own
        await until(async () => (await info(node.port, name))?.[7] === 1, 3000, `a waiter on node ${n}`);
        await holder.release();
        const h = await waiting;
        assert.ok(h.token > holder.token);
        assert.equal((await info(node.port, name))?.[1], h.owner);
        await h.release();
        assert.equal(await info(node.port, name), null);
      }
      await rl.close();
    });

    test('a wait follows its lock when the slot moves to another master (MOVED), and is served there', async () => {
      const rl = new RLock(await client());
      const tag = tagOn(cl, 1, ['{n1t0}']);
      const name = `${tag}:moving`;
      const slot = slotOf(name);
      const holder = await rl.lock(name).acquire({ leaseMs: 10000 });
      const waiting = rl.lock(name).acquire({ waitMs: 8000, leaseMs: 10000 });
      await until(async () => (await info(cl.nodes[1]!.port, name))?.[7] === 1, 3000, 'the waiter queued on node 1');
      await migrate(cl, slot, 1, 2);
      // the old node answers the waiter MOVED; the wait is sent again to the new one
      await until(async () => (await info(cl.nodes[2]!.port, name))?.[7] === 1, 3000, 'the waiter queued on node 2');
      await holder.release(); // routed to node 2 (MOVED followed by the driver)
      const h = await waiting;
      assert.ok(h.token > holder.token);
      assert.equal((await info(cl.nodes[2]!.port, name))?.[1], h.owner);
      await h.release();
      assert.equal(await info(cl.nodes[2]!.port, name), null);
      await rl.close();
    });

    test('while a slot migrates, an acquire of a lock not on the old node is asked there (ASK), waits and one tries', async () => {
      const rl = new RLock(await client());
      const tag = tagOn(cl, 0, ['{n0t0}']);
      const slot = slotOf(tag);
      await migrate(cl, slot, 0, 1, false); // no key yet: the slot is MIGRATING / IMPORTING
      const waited = await rl.lock(`${tag}:a`).acquire({ waitMs: 3000, leaseMs: 10000 });
      const tried = await rl.lock(`${tag}:b`).tryAcquire({ leaseMs: 10000 });
      assert.ok(tried !== null);
      assert.deepEqual(await on(cl.nodes[0]!.port, ['CLUSTER', 'COUNTKEYSINSLOT', String(slot)]), 0);
      await finishMigration(cl, slot, 1);
      assert.equal((await info(cl.nodes[1]!.port, `${tag}:a`))?.[1], waited.owner);
      assert.equal((await info(cl.nodes[1]!.port, `${tag}:b`))?.[1], tried.owner);
      await waited.release();
      await tried.release();
      assert.equal(await info(cl.nodes[1]!.port, `${tag}:a`), null);
      assert.equal(await info(cl.nodes[1]!.port, `${tag}:b`), null);
      await rl.close();
    });

    test('tokens above 2^53 are exact from every acquire: one try, a wait, a read-write lock\'s writer', async () => {
      const rl = new RLock(await client());
      const near = 2n ** 63n - 100n; // a JavaScript number would round it
      const names = await namesOn(cl, 'big');
      for (let n = 0; n < 3; n++) {
        const name = names[n]!;
        await on(cl.nodes[n]!.port, ['SET', `redisson_lock_token:${name}`, near.toString()]);
        const first = await rl.lock(name).tryAcquire({ leaseMs: 10000 });
        assert.equal(first?.token, near + 1n, `one try on node ${n}`);
        const waiting = rl.lock(name).acquire({ waitMs: 5000, leaseMs: 10000 });
        await until(async () => (await info(cl.nodes[n]!.port, name))?.[7] === 1, 3000, 'the waiter queued');
        await first!.release();
        const second = await waiting;
        assert.equal(second.token, near + 2n, `after a wait on node ${n}`);
        await second.release();
        const w = await rl.rwLock(name).write.tryAcquire({ leaseMs: 10000 });
        assert.equal(w?.token, near + 3n, `a writer's one try on node ${n}`);
        await w!.release();
        assert.equal(String(await on(cl.nodes[n]!.port, ['GET', `redisson_lock_token:${name}`])), (near + 3n).toString());
      }
      await rl.close();
    });

    // last: it stops a master for the rest of the file
    test('a master down: acquires on its slots end by their deadlines, locks on the other masters keep working', async () => {
      const rl = new RLock(await client(), { responseTimeoutMs: 300 });
      const [up0, up1, downName] = (await namesOn(cl, 'down')) as [string, string, string];
      const upNames = [up0, up1];
      const held = await rl.lock(downName).acquire({ leaseMs: 10000 });
      const waiting = rl.lock(downName).acquire({ waitMs: 1500, leaseMs: 10000 }).then((h) => h, (e: unknown) => e);
      assert.equal((await info(cl.nodes[2]!.port, downName))?.[1], held.owner);
      await until(async () => (await info(cl.nodes[2]!.port, downName))?.[7] === 1, 3000, 'the waiter queued on node 2');
      // the others keep serving their slots while one is missing
      for (const s of cl.nodes.slice(0, 2)) await on(s.port, ['CONFIG', 'SET', 'cluster-require-full-coverage', 'no']);
      const t0 = Date.now();
      await cl.nodes[2]!.stop();
      const waited = await waiting;
      assert.ok(waited instanceof LockTimeout || waited instanceof Error, `the wait on the dead node: ${String(waited)}`);
      assert.ok(Date.now() - t0 < 1500 + 1500, `the wait ended by its deadline (${Date.now() - t0} ms)`);
      for (const attempt of [() => rl.lock(downName).tryAcquire({ leaseMs: 10000 }), () => rl.lock(`${downName}2`).acquire({ waitMs: 500, leaseMs: 10000 })]) {
        const t = Date.now();
        const r = await attempt().then((h) => h, (e: unknown) => e);
        assert.ok(r === null || r instanceof Error, `nothing granted by a dead node: ${String(r)}`);
        assert.ok(Date.now() - t < 500 + 1500, `ended in time (${Date.now() - t} ms)`);
      }
      for (let i = 0; i < 3; i++) {
        for (const name of upNames) {
          const h = await rl.lock(name).acquire({ waitMs: 2000, leaseMs: 10000 });
          const n = upNames.indexOf(name);
          assert.equal((await info(cl.nodes[n]!.port, name))?.[1], h.owner);
          await h.release();
          assert.equal(await info(cl.nodes[n]!.port, name), null);
        }
      }
      // the hold on the dead node is left to its lease (its release could reach no one)
      await rl.close(100);
    });
  });
}
