import { LockLost } from './errors.js';
import { abortReason, bounded, now, toEpoch } from './util.js';

/** What a lease belongs to (a lock handle, a leased semaphore). */
export interface LeaseHolder {
  readonly label: string;
  /** The lease is over (lost or released): no longer the holder's current one. */
  dropped(lease: Lease): void;
}

/**
 * One continuous hold with a lease: `validUntil` (monotonic ms, from when the granting command was
 * sent), a lease-end timer that declares it lost, and for a hold taken without a lease a watchdog
 * renewing it every third of its lease (`renew`: true renewed, false found gone; a failure is
 * tried again backing off from 50 ms up to the period, until the lease ends). Timers `unref()`ed.
 */
export class Lease {
  /** Grants counted on this hold (re-entries). */
  count = 1;
  lost = false;
  ended = false;
  validUntil: number;
  // made when first asked for (most holds never are) or when lost
  #controller: AbortController | undefined;
  #renewTimer: NodeJS.Timeout | undefined;
  #endTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly holder: LeaseHolder,
    readonly leaseMs: number,
    readonly watchdog: boolean,
    sentAt: number,
    private readonly renew: () => Promise<boolean>,
    private readonly responseTimeoutMs: number,
  ) {
    this.validUntil = sentAt + leaseMs;
    this.#armEnd();
    if (watchdog) this.#armRenewal(leaseMs / 3);
  }

  /** Aborted (its reason a `LockLost`) when the hold is lost. */
  get signal(): AbortSignal {
    this.#controller ??= new AbortController();
    return this.#controller.signal;
  }

  #armEnd(): void {
    clearTimeout(this.#endTimer);
    this.#endTimer = setTimeout(() => this.markLost('its lease ended'), Math.max(0, this.validUntil - now()));
    this.#endTimer.unref();
  }

  #armRenewal(delay: number, backoff = 50): void {
    clearTimeout(this.#renewTimer);
    this.#renewTimer = setTimeout(() => void this.#renewal(backoff), Math.max(0, delay));
    this.#renewTimer.unref();
  }

  async #renewal(backoff: number): Promise<void> {
    if (this.ended || this.lost) return;
    const sentAt = now();
    try {
      const held = await bounded(this.renew(), this.responseTimeoutMs, 'a renewal');
      if (this.ended || this.lost) return;
      if (!held) return this.markLost('its renewal found it gone');
      this.extend(sentAt + this.leaseMs);
      this.#armRenewal(this.leaseMs / 3);
    } catch {
      if (this.ended || this.lost) return;
      const period = this.leaseMs / 3;
      const delay = Math.min(backoff, period, Math.max(0, this.validUntil - now()));
      this.#armRenewal(delay, Math.min(period, Math.max(50, backoff * 2)));
    }
  }

  /** The server holds it at least until `until` (monotonic ms). */
  extend(until: number): void {
    if (until > this.validUntil) {
      this.validUntil = until;
      this.#armEnd();
    }
  }

  markLost(why: string): void {
    if (this.lost || this.ended) return;
    this.lost = true;
    this.stop();
    this.holder.dropped(this);
    this.#controller ??= new AbortController();
    this.#controller.abort(new LockLost(`the hold of ${this.holder.label} was lost: ${why}`, this.holder.label));
  }

  /** Released: timers stopped, no longer the holder's. */
  end(): void {
    this.ended = true;
    this.stop();
    this.holder.dropped(this);
  }

  stop(): void {
    clearTimeout(this.#renewTimer);
    clearTimeout(this.#endTimer);
  }

  lostError(): LockLost {
    const r: unknown = this.#controller?.signal.reason;
    return r instanceof LockLost ? r : new LockLost(`the hold of ${this.holder.label} was lost`, this.holder.label);
  }
}

/**
 * What a caller holds under a lease (a lock's grant, leased permits): until when it is valid, a
 * signal aborted when it is lost, whether it was released. `release()` is the holder's own.
 */
export abstract class Leased implements AsyncDisposable {
  readonly #lease: Lease;
  #released = false;

  /** @internal */
  protected constructor(lease: Lease) {
    this.#lease = lease;
  }

  /** @internal */
  protected get lease(): Lease {
    return this.#lease;
  }

  /** @internal Marks it released (or not, when a release was refused). */
  protected setReleased(released: boolean): void {
    this.#released = released;
  }

  /** Until when (epoch ms, from a monotonic clock) the server holds it at least. */
  get validUntil(): number {
    return toEpoch(this.#lease.validUntil);
  }

  /** Aborted (its reason a `LockLost`) when it is lost: its lease ended, its renewal found it
   * gone or kept failing. */
  get signal(): AbortSignal {
    return this.#lease.signal;
  }

  /** Whether it was lost before its release. */
  get lost(): boolean {
    return this.#lease.lost;
  }

  /** Whether it was released. */
  get released(): boolean {
    return this.#released;
  }

  /** Throws `LockLost` when it was lost. */
  check(): void {
    if (this.#lease.lost) throw this.#lease.lostError();
  }

  #releasing: Promise<void> | null = null;

  /** Gives it back. Idempotent: later calls do nothing; a call while one is in flight gets its
   * outcome. Throws `LockLost` when it was lost before (sending nothing) or the release found it
   * gone. */
  release(): Promise<void> {
    if (this.#releasing !== null) return this.#releasing; // one in flight: its outcome
    if (this.#released) return Promise.resolve();
    const p = this.releaseOnce().finally(() => (this.#releasing = null));
    this.#releasing = p;
    return p;
  }

  /** @internal The release itself (marks it released; unmarks it when refused). */
  protected abstract releaseOnce(): Promise<void>;

  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }
}

/**
 * The instant (monotonic ms) a fresh grant's lease is known to run from. The server starts it
 * when it grants, which the client only bounds by when it sent the command: after a wait that
 * lasted most of the lease (a watchdog lease shorter than the wait, a reply that came late) that
 * bound is past or nearly, and the hold would be handed over lost while the server holds it. Then
 * the grant is confirmed by a renewal (`renew`: true held, false gone), whose send time is the
 * new bound. Null: gone, or no answer in time (the caller gives the grant back); an abort
 * rejects with the signal's reason.
 */
export async function grantStart(
  sentAt: number,
  leaseMs: number,
  renew: () => Promise<boolean>,
  responseTimeoutMs: number,
  signal?: AbortSignal,
): Promise<number | null> {
  if (now() - sentAt <= (leaseMs * 2) / 3) return sentAt;
  const again = now();
  try {
    return (await bounded(renew(), responseTimeoutMs, 'a renewal', signal)) ? again : null;
  } catch (e) {
    if (signal?.aborted && e === abortReason(signal)) throw e;
    return null;
  }
}
