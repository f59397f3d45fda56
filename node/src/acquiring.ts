import { ServerError, type Arg, type Connection, type SendOptions } from './adapter.js';
import { fromReply, RLockClosed, SessionClosed } from './errors.js';
import { abortReason, bounded, isCancelledReply, newId, now, sleep, Stalled, transientReply } from './util.js';

/** What an acquire needs of its client (an `RLock`). */
export interface Engine {
  readonly conn: Connection;
  readonly responseTimeoutMs: number;
  /** How many times the client was closed (absent: never closes): a wait begun before a close
   * ends with `RLockClosed` (its request cancelled) instead of opening a new connection. */
  readonly closes?: number;
  /** A dedicated connection for a wait on `key`. */
  openWait(signal?: AbortSignal, key?: Arg, options?: SendOptions): Promise<Connection>;
  /** Closes a wait's connection; `flush`: it failed, or a failover answered (connections kept
   * for the same server may be stale too). */
  closeWait(c: Connection, flush?: boolean): Promise<void>;
  /** A wait's connection whose last reply was read: may be kept for another wait (absent:
   * closed). */
  doneWait?(c: Connection): Promise<void>;
  cancel(key: Arg, rid: string, leaseMs: number): Promise<void>;
}

/** One kind of acquire: its command and how to read its reply. */
export interface AcquireSpec<G> {
  readonly key: Arg;
  readonly label: string;
  /** The command, with `REQUEST rid`, and `WAIT wait` unless `wait` is null (one try). */
  args(rid: string, wait: number | null): Arg[];
  /** The grant in `reply`; else `again`: not granted, but asked again at once while time is
   * left (a lock freed at that instant but not grantable then). */
  read(reply: unknown): { grant: G } | { again: boolean };
  /** The grant's lease (how long its cancel is worth sending); 0: none. */
  readonly leaseMs: number;
  readonly send?: SendOptions;
}

export interface Granted<G> {
  grant: G;
  rid: string;
  /** When the granting command was sent (monotonic ms): the lease runs from at most then. */
  sentAt: number;
}

/**
 * One acquire, waiting up to `waitMs` in the server (undefined: no limit; 0: one try on the
 * client's own connection), the wait on a dedicated connection. The decisions are the Python
 * client's (`_core.Acquiring`): from the moment a command is sent its request may be queued or
 * granted, so whenever the acquire ends without handing a grant over (an abort at any moment, no
 * reply in time, a failed connection, an abort landing with the grant) `RLOCK.CANCEL key rid`
 * gives back exactly what it got. A failed connection asks again with the same id within the
 * deadline; `was cancelled` (a grant the server rolled back) asks again with a new id; an error
 * reply changed nothing and is thrown as the package's error. Returns null when not granted.
 *
 * A wait's check (the same acquire, one try, same id) left unanswered may still run later: a
 * driver sends it again on its next connection (ioredis), or a stalled server runs it when it
 * resumes. Run after this grant was given back, it would be a new acquire (the server's record
 * says the grant is over), a hold nobody has. So a grant is handed over only when every check
 * of its request has been answered (given a response timeout to be); else the grant is given
 * back with `RLOCK.CANCEL key rid`, which also makes the server refuse that id from then on
 * (`was cancelled`), and the acquire asks again with a new id in the time left. An acquire
 * that ends without a grant cancels its request whenever a check may still be on its way.
 */
export async function acquireOnce<G>(
  eng: Engine,
  spec: AcquireSpec<G>,
  waitMs: number | undefined,
  signal?: AbortSignal,
): Promise<Granted<G> | null> {
  const t0 = now();
  const end = waitMs === undefined ? Infinity : t0 + waitMs;
  // one try: transient failures tried again for one response timeout
  const retryEnd = waitMs === 0 ? t0 + eng.responseTimeoutMs : end;
  let rid = newId();
  let needCancel = false;
  let backoff = 20;
  let conn: Connection | null = null;
  // the wait connection's last reply was read: nothing pending on it, it may serve another wait
  let idle = false;
  // an acquire that may wait first tries once on the client's connection (no WAIT, the same
  // request id: a try not granted records nothing): the server grants no barging, so FIFO
  // holds, and an uncontended acquire needs no wait connection
  let tryFirst = waitMs !== 0;
  // checks of the request `rid` sent and not answered yet
  let checks = new Set<Promise<unknown>>();
  const closes = eng.closes;
  const stillOpen = (): void => {
    if (eng.closes !== closes) throw new RLockClosed('the RLock was closed during this acquire');
  };
  try {
    for (;;) {
      if (signal?.aborted) throw abortReason(signal);
      const t = now();
      const trying = tryFirst;
      tryFirst = false;
      let wait: number | null;
      if (waitMs === 0 || trying) wait = null;
      else if (end === Infinity) wait = 0;
      else wait = end > t ? Math.max(1, Math.ceil(end - t)) : null;
      const args = spec.args(rid, wait);
      let reply: unknown;
      // the wait was sent (its connection open): a Stalled is then its time running out, not a
      // connection slow to open (which is asked again within the deadline, as a failed one)
      let waitSent = false;
      const sentAt = now();
      try {
        if (wait === null) {
          needCancel = true;
          // a copy left unanswered may run later, after a grant of this id was given back
          // (ioredis resends unanswered commands when it reconnects): tracked as a check is
          const sent = tracked(checks, eng.conn.send(args, spec.send));
          reply = await bounded(sent, eng.responseTimeoutMs, String(args[0]), signal);
        } else {
          if (conn === null) {
            stillOpen();
            conn = await eng.openWait(signal, spec.key, spec.send);
            try {
              stillOpen(); // closed while it was being opened
            } catch (e) {
              await eng.closeWait(conn);
              conn = null;
              throw e;
            }
          }
          needCancel = true;
          idle = false;
          waitSent = true;
          const within = wait === 0 ? Infinity : wait + eng.responseTimeoutMs;
          const got = await waitReply(eng, conn, args, spec.args(rid, null), within, spec.send, checks, signal);
          if (got.silent) {
            // the server no longer queues the wait, yet its connection brought no reply (gone
            // without a word, or a failover): dropped; the check's answer is the wait's
            await eng.closeWait(conn, true);
            conn = null;
            if (got.reply instanceof Error) throw got.reply;
            const r = spec.read(got.reply);
            if (!('grant' in r)) {
              // not queued there, not granted: asked again with the same id and the time left
              if (now() < end) continue;
              needCancel = false;
              return null;
            }
          }
          reply = got.reply;
          idle = !got.silent;
        }
      } catch (e) {
        if (signal?.aborted && e === abortReason(signal)) throw e;
        // a session's connection is gone, or the RLock closed: never asked again
        if (e instanceof SessionClosed || e instanceof RLockClosed) throw e;
        if (isCancelledReply(e)) {
          needCancel = false; // holds nothing and never will: a new request, with the time left
          if (waitMs !== 0 && now() < end) {
            rid = newId();
            continue;
          }
          return null;
        }
        if (e instanceof ServerError && !transientReply(e)) {
          if (/^NOREPLICAS\b/.test(e.message) && waitMs !== 0 && now() + Math.min(backoff, 50) < end) {
            await sleep(Math.min(backoff, end - now()), signal);
            backoff = Math.min(backoff * 2, 1000);
            continue;
          }
          needCancel = false; // an error reply changed nothing
          throw fromReply(e.message, spec.label);
        }
        // no reply in time, or a failed connection: the request may be queued or granted
        if (conn !== null) {
          await eng.closeWait(conn, !(e instanceof Stalled));
          conn = null;
        }
        if (e instanceof Stalled && waitSent) return null; // the wait's time is up: cancelled below
        if (trying) continue; // the wait asks again, with the same id
        const t2 = now();
        if (t2 >= retryEnd) {
          if (waitMs === 0) throw e;
          return null;
        }
        await sleep(Math.min(backoff, retryEnd - t2), signal);
        backoff = Math.min(backoff * 2, 1000);
        continue;
      }
      const read = spec.read(reply);
      if ('grant' in read) {
        if (signal?.aborted) throw abortReason(signal); // landed with the grant: cancelled below
        if (checks.size > 0) {
          // a check of this request may still run after the grant is given back: answered
          // within a response timeout, it is harmless; else the grant goes back (cancelled, its
          // id refused from now on) and the acquire asks again with a new id
          await bounded(Promise.allSettled([...checks]), eng.responseTimeoutMs, 'a wait check', signal).catch((e: unknown) => {
            if (signal?.aborted && e === abortReason(signal)) throw e;
          });
          if (checks.size > 0) {
            await eng.cancel(spec.key, rid, spec.leaseMs);
            needCancel = false;
            checks = new Set();
            rid = newId();
            if (waitMs !== 0 && now() < end) continue;
            return null;
          }
        }
        needCancel = false;
        return { grant: read.grant, rid, sentAt };
      }
      needCancel = false; // not granted: nothing held
      if ((trying || (read.again && wait !== null)) && now() < end) continue;
      return null;
    }
  } finally {
    // a check still on its way may be granted later: cancelled too
    if (needCancel || checks.size > 0) await eng.cancel(spec.key, rid, spec.leaseMs);
    if (conn !== null) {
      if (idle && eng.doneWait) await eng.doneWait(conn);
      else await eng.closeWait(conn);
    }
  }
}

/** A wait that lasts is checked from another connection every this many ms (at least 1 s, 5
 * response timeouts): well within the 60 s a request record lives. */
export const probeEvery = (responseTimeoutMs: number): number => Math.max(1000, 5 * responseTimeoutMs);

/**
 * The reply of the wait `args` on `conn` within `within` ms; while none comes, checked every
 * {@link probeEvery} by sending `probe` (the same acquire without `WAIT`, same request id) on the
 * client's own connection, as the Python client does: `already waiting` means the server still
 * queues it; a reply (the grant replayed, or not granted) or `was cancelled` means it does not,
 * though its connection said nothing: `silent`, with that answer (an error reply as an Error).
 * No answer, or another error, concludes nothing. A check sent stays in `checks` until answered.
 */
async function waitReply(
  eng: Engine,
  conn: Connection,
  args: Arg[],
  probe: Arg[],
  within: number,
  send: SendOptions | undefined,
  checks: Set<Promise<unknown>>,
  signal?: AbortSignal,
): Promise<{ reply: unknown; silent: boolean }> {
  const pending = conn.send(args, send);
  pending.catch(() => {});
  const end = now() + within;
  const every = probeEvery(eng.responseTimeoutMs);
  for (;;) {
    const slice = Math.min(end - now(), every);
    try {
      return { reply: await bounded(pending, Math.max(0, slice), String(args[0]), signal), silent: false };
    } catch (e) {
      if (!(e instanceof Stalled)) throw e;
      if (now() >= end) throw new Stalled(String(args[0]), within);
    }
    let answer: unknown;
    const check = tracked(checks, eng.conn.send(probe, send));
    try {
      answer = await bounded(check, eng.responseTimeoutMs, String(probe[0]), signal);
    } catch (e) {
      if (signal?.aborted && e === abortReason(signal)) throw e;
      if (isCancelledReply(e)) return { reply: e, silent: true };
      continue; // still waiting there (`already waiting`), or no conclusion
    }
    return { reply: answer, silent: true };
  }
}

/** `p`, kept in `checks` until it settles (a command of the request that may still run). */
function tracked<T>(checks: Set<Promise<unknown>>, p: Promise<T>): Promise<T> {
  checks.add(p);
  const answered = (): void => void checks.delete(p);
  p.then(answered, answered);
  return p;
}
