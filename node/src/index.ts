export { RLock, Lock, Hold, withLock } from './lock.js';
export type { RLockOptions, AcquireOptions } from './lock.js';
export type { Arg, Connection } from './adapter.js';
export { adapt, ServerError } from './adapter.js';
export * from './errors.js';
