import { randomBytes } from 'node:crypto';
import { ServerError } from './adapter.js';
import { LockLost } from './errors.js';
import { MAX_MS } from './validate.js';

// Node 20 has Symbol.asyncDispose (as Symbol.for('nodejs.asyncDispose')); older runtimes get it here.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for('nodejs.asyncDispose');

/** Monotonic ms. */
export const now = (): number => performance.now();
/** A monotonic instant as epoch ms. */
export const toEpoch = (mono: number): number => performance.timeOrigin + mono;

/** How long a lock's release is sent again after transient failures (the server remembers a
 * release by its id 10 s). */
export const RELEASE_RESEND_MS = 6000;
/** How long the server remembers a request's outcome without a lease (its cancelled record). */
export const REQUEST_RECORD_MS = 60000;

/** An error reply worth sending the same idempotent command again after (`UNBLOCKED`: a
 * failover ended a wait, the master turning replica; `READONLY`: sent to a replica). */
export function transientReply(e: ServerError): boolean {
  return /^(LOADING|BUSY|TRYAGAIN|MASTERDOWN|READONLY|CLUSTERDOWN|UNBLOCKED)\b/.test(e.message);
}

/** A failure after which an idempotent command is sent again: no reply, a failed connection, a
 * transient error reply. */
export function isTransient(e: unknown): boolean {
  return e instanceof ServerError ? transientReply(e) : !(e instanceof LockLost);
}

/** `ERR request <id> was cancelled`: the request holds nothing and never will. */
export function isCancelledReply(e: unknown): boolean {
  return e instanceof ServerError && e.message.startsWith('ERR request ') && e.message.endsWith('was cancelled');
}

/** No reply in time. */
export class Stalled extends Error {
  constructor(what: string, ms: number) {
    super(`no reply to ${what} within ${ms} ms`);
    this.name = 'Stalled';
  }
}

// random bytes drawn 4 KiB at a time: one system call per 256 ids
let entropy: Buffer = Buffer.alloc(0);
let entropyAt = 0;

/** A fresh request id: 16 random bytes, hex. */
export function newId(): string {
  if (entropyAt + 16 > entropy.length) {
    entropy = randomBytes(4096);
    entropyAt = 0;
  }
  const id = entropy.toString('hex', entropyAt, entropyAt + 16);
  entropyAt += 16;
  return id;
}

export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('This operation was aborted', 'AbortError');
}

/** `p`, or a rejection: `Stalled` after `ms` (Infinity: never), the signal's reason on abort. */
export function bounded<T>(p: Promise<T>, ms: number, what: string, signal?: AbortSignal): Promise<T> {
  p.catch(() => {}); // settled later, perhaps never read
  return new Promise<T>((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const done = (): void => {
      if (timer !== undefined) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    const onAbort = (): void => {
      done();
      reject(abortReason(signal!));
    };
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    if (ms !== Infinity) timer = setTimeout(() => (done(), reject(new Stalled(what, ms))), Math.min(ms, MAX_MS));
    p.then(
      (v) => (done(), resolve(v)),
      (e: unknown) => (done(), reject(e)),
    );
  });
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return bounded(new Promise<void>((r) => setTimeout(r, Math.max(0, ms))), Infinity, 'sleep', signal);
}
