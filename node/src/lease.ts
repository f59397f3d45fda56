import { LockLost } from './errors.js';
import { abortReason, bounded, now } from './util.js';

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
  readonly controller = new AbortController();
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
    this.controller.abort(new LockLost(`the hold of ${this.holder.label} was lost: ${why}`, this.holder.label));
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
    const r: unknown = this.controller.signal.reason;
    return r instanceof LockLost ? r : new LockLost(`the hold of ${this.holder.label} was lost`, this.holder.label);
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
