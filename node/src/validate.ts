import { InvalidArgument } from './errors.js';

/** The longest wait or lease taken, in ms (about 24.8 days): a JavaScript timer's limit. */
export const MAX_MS = 2 ** 31 - 1;
/** The shortest watchdog lease, in ms: renewed every third of it. */
export const MIN_WATCHDOG_MS = 100;

/** A lock name: a string or a Buffer (bytes sent as they are). */
export function name(value: unknown): string | Buffer {
  if (typeof value === 'string') return value;
  if (Buffer.isBuffer(value)) return Buffer.from(value);
  if (value instanceof Uint8Array) return Buffer.from(value);
  throw new InvalidArgument(`a lock name must be a string or a Buffer, got ${describe(value)}`);
}

export function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'number') return `the number ${value}`;
  return typeof value;
}

/** A duration in ms: undefined (absent), or a finite number within [min, MAX_MS], rounded up. */
export function ms(value: unknown, what: string, min: number): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'number') {
    throw new InvalidArgument(`${what} must be a number of milliseconds, got ${describe(value)}`);
  }
  if (!Number.isFinite(value)) throw new InvalidArgument(`${what} must be finite, got ${value}`);
  if (value < min) throw new InvalidArgument(`${what} must be at least ${min} ms, got ${value}`);
  if (value > MAX_MS) throw new InvalidArgument(`${what} must be at most ${MAX_MS} ms, got ${value}`);
  return Math.ceil(value);
}

export function signal(value: unknown): AbortSignal | undefined {
  if (value === undefined) return undefined;
  if (value instanceof AbortSignal) return value;
  throw new InvalidArgument(`signal must be an AbortSignal, got ${describe(value)}`);
}

export function options(value: unknown, what: string): Record<string, unknown> {
  if (value === undefined) return {};
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new InvalidArgument(`${what} must be an object, got ${describe(value)}`);
  }
  return value as Record<string, unknown>;
}

/** Refuses option names the call does not know (a typo would be silently ignored otherwise). */
export function known(opts: Record<string, unknown>, names: readonly string[], what: string): void {
  for (const k of Object.keys(opts)) {
    if (!names.includes(k)) throw new InvalidArgument(`${what}: unknown option ${JSON.stringify(k)}`);
  }
}

/** A whole number within [min, max] (absent: `dflt`). */
export function int(value: unknown, what: string, min: number, max: number, dflt?: number): number {
  if (value === undefined && dflt !== undefined) return dflt;
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw new InvalidArgument(`${what} must be a whole number, got ${describe(value)}`);
  }
  if (value < min || value > max) throw new InvalidArgument(`${what} must be from ${min} to ${max}, got ${value}`);
  return value;
}
