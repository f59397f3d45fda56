import assert from 'node:assert/strict';
import { createClient } from 'redis';
import { RLock } from '../src/index.js';
import { suite, until } from './harness.js';

/** A client of the server switched to database `db` at run time (SELECT), the way a user may. */
async function select(client: unknown, db: number): Promise<void> {
  await (client as { select(db: number): Promise<unknown> }).select(db);
}

/** Known defect, not fixed yet: a wait's connection (and, with ioredis, the twin that reads
 * integers exactly) is a `duplicate()` of the user's client, made from its options, so it is in
 * the database of those options, not the one the client SELECTed since. Unskip to see it fail. */
const KNOWN = 'defect: wait connections and the ioredis exact twin ignore a run-time SELECT';

suite('waits in the selected database', (ctx, test) => {
  test('a client switched to another database with SELECT waits for, and is granted, the lock in that database', async () => {
    const client = await ctx.client();
    await select(client, 3);
    const db3 = createClient({ socket: { host: '127.0.0.1', port: ctx.server.port }, database: 3 });
    db3.on('error', () => {});
    await db3.connect();
    try {
      const rl = new RLock(client);
      const holder = await rl.lock('sel:x').acquire({ leaseMs: 20000 });
      assert.ok((await db3.exists('sel:x')) === 1, 'the first (uncontended) hold is in database 3');
      const waiting = rl.lock('sel:x').acquire({ waitMs: 5000, leaseMs: 20000 });
      // the waiter must queue behind the holder in database 3, not be granted a lock of the
      // same name in database 0
      await until(async () => Number(((await db3.sendCommand(['RLOCK.INFO', 'sel:x'])) as unknown as unknown[] | null)?.[7] ?? 0) === 1 || (await ctx.admin.exists('sel:x')) === 1, 5000, 'the waiter queued (or granted in database 0)');
      assert.equal(await ctx.admin.exists('sel:x'), 0, 'nothing taken in database 0');
      await holder.release();
      const h = await waiting;
      assert.equal(await ctx.admin.exists('sel:x'), 0, 'nothing held in database 0');
      assert.equal(await db3.exists('sel:x'), 1, 'the waiter holds the lock in database 3');
      await h.release();
      assert.equal(await db3.exists('sel:x'), 0);
      await rl.close();
    } finally {
      db3.destroy();
    }
  }, { skip: process.env.RLOCK_UNSKIP_KNOWN ? false : KNOWN });
});
