import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import { createSentinel } from 'redis';
import { RLock } from '../src/index.js';
import { until } from './harness.js';
import { on, replicated, SentinelSet } from './topology.js';

interface SentinelDriver {
  name: string;
  connect(sentinelPort: number, name: string): Promise<{ client: unknown; close(): Promise<void> }>;
}

const sentinelDrivers: SentinelDriver[] = [
  {
    name: 'node-redis',
    async connect(port, name) {
      const c = createSentinel({ name, sentinelRootNodes: [{ host: '127.0.0.1', port }] });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: async () => void (await c.destroy().catch(() => {})) };
    },
  },
  {
    name: 'ioredis',
    async connect(port, name) {
      // failoverDetector: the client drops its master when the sentinels switch it (a paused
      // master says nothing)
      const c = new Redis({ sentinels: [{ host: '127.0.0.1', port }], name, lazyConnect: true, failoverDetector: true });
      c.on('error', () => {});
      await c.connect();
      return { client: c, close: async () => void c.disconnect() };
    },
  },
];

async function info(port: number, name: string): Promise<unknown[] | null> {
  return (await on(port, ['RLOCK.INFO', name])) as unknown[] | null;
}

for (const driver of sentinelDrivers) {
  describe(`sentinel (${driver.name})`, () => {
    const set = new SentinelSet('rlockmaster', 1000);
    const closers: (() => Promise<void>)[] = [];
    const client = async (): Promise<unknown> => {
      const c = await driver.connect(set.sentinelPort, set.name);
      closers.push(c.close);
      return c.client;
    };
    before(() => set.start());
    after(async () => {
      for (const c of closers.splice(0)) await c().catch(() => {});
      await set.stop();
    });
    const test = (name: string, fn: () => Promise<void>): void => {
      it(name, async () => {
        try {
          await fn();
        } catch (e) {
          process.stderr.write(`\n--- sentinel logs (${driver.name}: ${name}) ---\n${set.log()}\n---\n`);
          throw e;
        }
      });
    };

    /** Holds `name` and queues a waiter for it on the master; returns both and the master's port. */
    async function holdAndWait(rl: RLock, name: string) {
      const oldPort = await set.masterPort();
      const holder = await rl.lock(name).acquire({ leaseMs: 15000 });
      assert.equal(await replicated(oldPort), 1); // the hold is on the replica too
      const waiting = rl.lock(name).acquire({ waitMs: 12000, leaseMs: 10000 });
      waiting.catch(() => {});
      await until(async () => (await info(oldPort, name))?.[7] === 1, 3000, 'the waiter queued on the master');
      return { holder, waiting, oldPort };
    }

    /** After the round: the lock is free on the new master and, once in sync, on the old one. */
    async function nothingHeld(name: string, newPort: number, oldPort: number): Promise<void> {
      // a release the client's connection could not deliver at once (still on the paused
      // master) is sent on in the background for 6 s, until the driver has moved it; a driver
      // that moves later than that (a loaded machine) leaves the hold to its 10 s lease
      await until(async () => (await info(newPort, name)) === null, 12000, 'the lock free on the new master');
      // the old master made a replica of the new one, as the sentinel does (it looks every 10 s)
      await on(oldPort, ['REPLICAOF', '127.0.0.1', String(newPort)]);
      await set.synced(oldPort);
      assert.equal(await replicated(newPort), 1);
      assert.equal(await info(newPort, name), null, 'the lock free on the new master after the round');
      assert.equal(await info(oldPort, name), null, 'the lock free on the old master, in sync');
    }

    test('SENTINEL FAILOVER: a waiting acquire moves to the new master and is served there in its time', async () => {
      const rl = new RLock(await client(), { responseTimeoutMs: 300 });
      const name = 'sentinel:failover';
      const { holder, waiting, oldPort } = await holdAndWait(rl, name);
      await on(set.sentinelPort, ['SENTINEL', 'FAILOVER', set.name]);
      await until(async () => (await set.masterPort()) !== oldPort, 10000, 'the sentinel to name a new master');
      const newPort = await set.masterPort();
      // the wait ended on the old master (UNBLOCKED at its demotion, or its connection killed)
      // is sent again to the new one, where the hold was replicated
      await until(async () => (await info(newPort, name).catch(() => null))?.[7] === 1, 8000, 'the waiter queued on the new master');
      await holder.release();
      const h = await waiting;
      assert.ok(h.token > holder.token);
      assert.equal((await info(newPort, name))?.[1], h.owner);
      await h.release();
      await nothingHeld(name, newPort, oldPort);
      await rl.close();
    });

    test('a master paused past down-after: the silent wait is noticed and served by the new master', async () => {
      const rl = new RLock(await client(), { responseTimeoutMs: 300 });
      const name = 'sentinel:paused';
      const { holder, waiting, oldPort } = await holdAndWait(rl, name);
      const paused = oldPort === set.master.port ? set.master : set.replica;
      paused.signal('SIGSTOP');
      try {
        await until(async () => (await set.masterPort()) !== oldPort, 15000, 'the sentinel to name a new master');
        const newPort = await set.masterPort();
        assert.equal((await info(newPort, name))?.[1], holder.owner, 'the hold, replicated, is on the new master');
        // the wait's connection to the paused master says nothing: its check from the client's
        // connection (moved to the new master by the driver) finds it not queued there
        await until(async () => (await info(newPort, name).catch(() => null))?.[7] === 1, 8000, 'the waiter queued on the new master');
        await holder.release();
        const h = await waiting;
        assert.ok(h.token > holder.token);
        assert.equal((await info(newPort, name))?.[1], h.owner);
        await h.release();
        paused.signal('SIGCONT');
        await nothingHeld(name, newPort, oldPort);
      } finally {
        paused.signal('SIGCONT');
      }
      await rl.close();
    });
  });
}
