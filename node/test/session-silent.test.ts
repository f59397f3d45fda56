import assert from 'node:assert/strict';
import { createServer, connect, type Server as NetServer, type Socket } from 'node:net';
import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { RLock } from '../src/index.js';
import { suite, until, waiters } from './harness.js';

/** A TCP proxy to the server whose connections can be made silent (nothing forwarded either
 * way, no close passed on), as a cut network does. */
class Proxy {
  readonly pairs: { client: Socket; server: Socket; silent: boolean }[] = [];
  #srv: NetServer | null = null;
  port = 0;
  async start(target: number): Promise<void> {
    this.#srv = createServer((client) => {
      const server = connect(target, '127.0.0.1');
      const pair = { client, server, silent: false };
      this.pairs.push(pair);
      client.on('data', (d) => void (pair.silent || server.write(d)));
      server.on('data', (d) => void (pair.silent || client.write(d)));
      client.on('close', () => void (pair.silent || server.destroy()));
      server.on('close', () => void (pair.silent || client.destroy()));
      client.on('error', () => {});
      server.on('error', () => {});
    });
    await new Promise<void>((r) => this.#srv!.listen(0, '127.0.0.1', r));
    const a = this.#srv.address();
    this.port = typeof a === 'object' && a !== null ? a.port : 0;
  }
  stop(): void {
    for (const p of this.pairs) (p.client.destroy(), p.server.destroy());
    this.#srv?.close();
  }
}

suite('a session whose connection goes silent', (ctx, test, driver) => {
  test('while one of its acquires waits: the keepalive still ends it, and its holds are lost once the server dropped the connection', async () => {
    const proxy = new Proxy();
    await proxy.start(ctx.server.port);
    let close: () => void;
    let client: unknown;
    if (driver.name === 'ioredis') {
      const c = new Redis({ host: '127.0.0.1', port: proxy.port, lazyConnect: true });
      c.on('error', () => {});
      await c.connect();
      (client = c), (close = () => c.disconnect());
    } else {
      const c = createClient({ socket: { host: '127.0.0.1', port: proxy.port, reconnectStrategy: false } });
      c.on('error', () => {});
      await c.connect();
      (client = c), (close = () => c.destroy());
    }
    const rl = new RLock(client, { responseTimeoutMs: 200 });
    try {
      const session = await rl.session({ keepaliveMs: 200 });
      const sessionPair = proxy.pairs[proxy.pairs.length - 1]!;
      const hold = await session.lock('silent:held').acquire({ leaseMs: 60000 });
      await ctx.admin.sendCommand(['RLOCK.ACQUIRE', 'silent:busy', 'someone', '60000']);
      const waiting = session.lock('silent:busy').acquire().catch((e: unknown) => e);
      await until(async () => (await waiters(ctx.admin, 'silent:busy')) === 1, 3000, 'the session acquire waiting');
      sessionPair.silent = true; // the network to the session's connection is cut
      await ctx.admin.sendCommand(['CLIENT', 'KILL', 'ID', String(session.clientId)]); // the server drops it (as its tcp-keepalive would)
      assert.ok(!(await ctx.admin.exists('silent:held')), 'the server ended the session hold');
      await until(() => hold.lost, 3000, 'the session hold to be taken as lost (keepalive 200 ms)').catch(() => {});
      assert.equal(hold.lost, true, 'a session hold the server ended is not taken as live');
      assert.equal(session.closed, true, 'the session ended');
      assert.ok((await waiting) instanceof Error, 'the waiting acquire ended');
    } finally {
      await rl.close(500);
      close!();
      proxy.stop();
      await ctx.admin.sendCommand(['RLOCK.FORCERELEASE', 'silent:busy']);
    }
  });
});
