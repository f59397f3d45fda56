/**
 * Errors. Every one the package raises for a lock is an {@link RLockError} with a stable `code`
 * (catch `RLockError` to catch them all); bad arguments are {@link InvalidArgument}, a
 * `TypeError`, raised before anything is sent. They mirror the Python client's errors.
 */

export type RLockErrorCode =
  | 'RLOCK_ERROR'
  | 'RLOCK_TIMEOUT'
  | 'RLOCK_NOT_HELD'
  | 'RLOCK_LOST'
  | 'RLOCK_NO_REPLICAS'
  | 'RLOCK_MODULE_MISSING'
  | 'RLOCK_WRONG_TYPE'
  | 'RLOCK_UPGRADE_REFUSED'
  | 'RLOCK_DEADLOCK'
  | 'RLOCK_SESSION_CLOSED'
  | 'RLOCK_CLOSED'
  | 'RLOCK_PERMISSION';

/** Base of this package's errors; also what an unexpected server error reply becomes. */
export class RLockError extends Error {
  readonly code: RLockErrorCode = 'RLOCK_ERROR';
  /** The lock's name, when the error is about one lock. */
  readonly lockName: string | undefined;
  constructor(message: string, lockName?: string) {
    super(message);
    this.name = new.target.name;
    this.lockName = lockName;
  }
}

/** The lock could not be taken within the acquire's `waitMs`. */
export class LockTimeout extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_TIMEOUT';
}

/** The hold to release, renew or check is not held by this caller. */
export class NotHeld extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_NOT_HELD';
}

/** The hold ended before its release: its lease ran out, its renewal failed, or the lock was
 * deleted or taken away (`RLOCK.FORCERELEASE`, a failover that lost it, a flush). Raised by
 * `check()`, by `release()` of such a hold (which then sends nothing) and by a re-entry of it. */
export class LockLost extends NotHeld {
  override readonly code: RLockErrorCode = 'RLOCK_LOST';
}

/** The master grants nothing: too few of its replicas are in sync (`NOREPLICAS`). */
export class NoReplicas extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_NO_REPLICAS';
}

/** The server does not know the rlock commands: load the module (`--loadmodule`). */
export class ModuleMissing extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_MODULE_MISSING';
}

/** The key holds another kind of value (another kind of lock, or not a lock at all). */
export class WrongType extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_WRONG_TYPE';
}

/** A write acquire by an owner that holds the read side: it would wait for itself. */
export class UpgradeRefused extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_UPGRADE_REFUSED';
}

/** The server refused the wait (`DEADLOCK`): it would have closed a cycle of owners. Nothing was
 * taken or queued. `cycle` is the server's description of it. */
export class Deadlock extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_DEADLOCK';
  readonly cycle: string;
  constructor(message: string, lockName?: string, cycle = '') {
    super(message, lockName);
    this.cycle = cycle;
  }
}

/** The session's connection closed: its holds ended, and it takes no more. */
export class SessionClosed extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_SESSION_CLOSED';
}

/** The `RLock` was closed (`RLock.close()`): a wait still on then ends (its request cancelled),
 * and no wait starts on it any more. */
export class RLockClosed extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_CLOSED';
}

/** The ACL user may not use a key or channel the command needs (`NOPERM`). */
export class LockPermissionError extends RLockError {
  override readonly code: RLockErrorCode = 'RLOCK_PERMISSION';
}

/** A bad argument (not a number, NaN, infinite, negative, too large, a name that is neither a
 * string nor a Buffer ...): raised at once, nothing sent. */
export class InvalidArgument extends TypeError {
  readonly code = 'RLOCK_BAD_ARGUMENT' as const;
  constructor(message: string) {
    super(message);
    this.name = 'InvalidArgument';
  }
}

/** The package's error for the error reply `message` of an rlock command on `lockName`. */
export function fromReply(message: string, lockName?: string): RLockError {
  const low = message.toLowerCase();
  if (message.startsWith('NOPERM')) return new LockPermissionError(message, lockName);
  const moduleCmd = ['rlock.', 'rwlock.', 'rsem.', 'rlatch.'].some((m) => low.includes(m));
  if (low.includes('unknown command') && moduleCmd) {
    return new ModuleMissing(`the server does not have the rlock module loaded (${message})`, lockName);
  }
  if (message.startsWith('WRONGTYPE')) return new WrongType(message, lockName);
  if (message.startsWith('NOREPLICAS')) return new NoReplicas(message, lockName);
  if (message.startsWith('DEADLOCK')) {
    let cycle = message.slice('DEADLOCK '.length);
    const lead = 'this wait would close a cycle: ';
    if (cycle.startsWith(lead)) cycle = cycle.slice(lead.length);
    return new Deadlock(message, lockName, cycle);
  }
  if (low.includes('upgrade refused')) return new UpgradeRefused(message, lockName);
  return new RLockError(message, lockName);
}
