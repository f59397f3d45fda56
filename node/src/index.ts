export { RLock, Lock, Hold, withLock } from './lock.js';
export type { RLockOptions, AcquireOptions } from './lock.js';
export { Semaphore, Permits, LeasedSemaphore, LeasedPermits, MAX_LEASED_PERMITS } from './semaphore.js';
export type { PermitOptions, LeasedPermitOptions } from './semaphore.js';
export type { Arg, Connection, SendOptions } from './adapter.js';
export { adapt, ServerError } from './adapter.js';
export { Stalled } from './util.js';
export * from './errors.js';
export * as compat from './compat.js';
