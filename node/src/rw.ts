import { UpgradeRefused } from './errors.js';
import { Turns, type RLock } from './lock.js';
import { Side, type SideOptions } from './side.js';
import * as V from './validate.js';

/**
 * A read-write lock handle (`rlock.rwLock(name)`): `RWLOCK.*` on Redisson's `RReadWriteLock`
 * layout. `read` and `write` have `Lock`'s API and act as one owner (as one Redisson thread):
 * holding write, a read acquire is granted at once (releasing write then downgrades); holding
 * read only, a write acquire is an upgrade, refused with `UpgradeRefused` (by the server for an
 * acquire that waits; at once, sending nothing, for a one-try, which the server would only
 * answer busy). Acquires of one handle take turns. While the handle holds nothing, its next
 * grant takes a new owner id (`<handle id>:<n>`).
 */
export class RWLock {
  readonly read: Side;
  readonly write: Side;
  /** This handle's id (owner ids of its holds are `<id>:<n>`). */
  readonly id: string;

  /** @internal */
  constructor(rl: RLock, key: string | Buffer, id: string, ownerId?: string, more?: Partial<SideOptions>) {
    this.id = id;
    const turns = new Turns();
    let gen = 0;
    const fixed = ownerId !== undefined;
    const ownerFor = (): string => ownerId ?? this.read.heldBy() ?? this.write.heldBy() ?? `${id}:${++gen}`;
    const label = typeof key === 'string' ? key : key.toString('latin1');
    this.read = new Side(rl, key, 'READ', turns, { ...more, ownerFor, fixedOwner: fixed });
    this.write = new Side(rl, key, 'WRITE', turns, {
      ...more,
      ownerFor,
      fixedOwner: fixed,
      beforeFresh: (waitMs) => {
        if (waitMs === 0 && this.read.isHeld()) {
          throw new UpgradeRefused(`upgrade refused: ${label} is held for read by this owner; a write acquire would wait for itself`, label);
        }
      },
    });
  }

  /** The lock's name as a string. */
  get label(): string {
    return this.read.label;
  }
}

/**
 * One owner id (`id`) for a unit of work: every lock taken through `lock(name)` and
 * `rwLock(name)` is held under it, as every lock of one Redisson thread is. The server's
 * wait-for graph follows owner ids: a wait that would close a cycle of owners is refused at
 * once with `Deadlock` (its `cycle`), nothing taken or queued.
 *
 * Handles of one name from one owner share one state: a hold of one is re-entered by the
 * other, counted here, and the server keeps count 1 per owner and name (per side), as for a
 * `Lock` handle. So no second server count exists that a cancel, a late renewal or a late
 * release of one handle could take from another's hold: a cancel gives back exactly the one
 * fresh grant it undoes, and a fresh grant of the owner waits for the give-backs and renewals
 * of its earlier hold of that name still in flight. An owner is one party: share it only
 * within one unit of work.
 */
export class Owner {
  /** The owner id every hold of this owner is held under. */
  readonly id: string;
  readonly #rl: RLock;
  readonly #locks = new Map<string, Side>();
  readonly #rw = new Map<string, RWLock>();

  /** @internal */
  constructor(rl: RLock, id: string) {
    this.#rl = rl;
    this.id = id;
  }

  /** A reentrant lock named `name`, held under this owner's id. */
  lock(name: string | Buffer): Side {
    const key = V.name(name);
    const k = Buffer.from(key).toString('hex');
    let side = this.#locks.get(k);
    if (side === undefined) {
      side = new Side(this.#rl, key, 'LOCK', new Turns(), { ownerFor: () => this.id, fixedOwner: true });
      this.#locks.set(k, side);
    }
    return side;
  }

  /** A read-write lock named `name`, both sides held under this owner's id. */
  rwLock(name: string | Buffer): RWLock {
    const key = V.name(name);
    const k = Buffer.from(key).toString('hex');
    let rw = this.#rw.get(k);
    if (rw === undefined) {
      rw = new RWLock(this.#rl, key, this.id, this.id);
      this.#rw.set(k, rw);
    }
    return rw;
  }
}
