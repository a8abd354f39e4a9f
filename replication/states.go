package replication

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// StateRecord is one key's saved state as a counter store hands it out: an
// opaque value whose first 8 bytes are, big-endian, the unix ns at which the
// state expires (decides as a fresh one would). The store writes and reads
// the rest.
type StateRecord struct {
	Key   string
	Value []byte
}

// SaveStates durably records, in one atomic synced batch, the states of the
// keys a store changed and the deletion of the keys it removed (gone first,
// so a key both removed and changed keeps its new state). Keys the store
// counts across PoPs are not here: SaveFlush saves their slots. It fails,
// writing nothing, with ErrDiskFull while the disk is full, and with an
// error naming the record when a value is shorter than its expiry.
//
// With nothing to save it writes nothing, but while the disk counts as full
// it still looks (with backoff) whether space came back, so that an idle PoP
// recovers too.
func (d *DB) SaveStates(changed []StateRecord, gone []string) error {
	if len(changed) == 0 && len(gone) == 0 {
		if d.guard.full() == nil {
			return nil
		}
		d.wmu.Lock()
		defer d.wmu.Unlock()
		return d.writable()
	}
	return d.write(func(pdb *pebble.DB) error { return d.saveStates(pdb, changed, gone) })
}

// saveStates is SaveStates' work; requires write's locks.
func (d *DB) saveStates(pdb *pebble.DB, changed []StateRecord, gone []string) error {
	start := time.Now()
	size := 32
	for _, r := range changed {
		if len(r.Value) < 8 {
			return fmt.Errorf("replication: pebble: save state of %q: value of %d bytes, shorter than its expiry", r.Key, len(r.Value))
		}
		size += 8 + len(r.Key) + len(r.Value)
	}
	for _, k := range gone {
		size += 8 + len(k)
	}
	b := pdb.NewBatchWithSize(size)
	defer b.Close()
	var key []byte
	for _, k := range gone {
		key = append(append(key[:0], tagState), k...)
		_ = b.Delete(key, nil) // fails only on a closed batch; Commit reports any error
	}
	for _, r := range changed {
		key = append(append(key[:0], tagState), r.Key...)
		_ = b.Set(key, r.Value, nil)
	}
	if err := d.commitSave(b); err != nil {
		return fmt.Errorf("replication: pebble: save %d states, %d deletions: %w", len(changed), len(gone), err)
	}
	d.flushes.Add(1)
	d.lastFlushNanos.Store(int64(time.Since(start)))
	d.lastFlushSlots.Store(int64(len(changed) + len(gone)))
	return nil
}

// LoadStates calls restore with every saved state not expired at now, in key
// order, and deletes the expired ones (unless the disk is full). restore
// must copy what it keeps of value. An error from restore stops the load and
// is returned; a damaged table is ErrCorrupt naming it.
func (d *DB) LoadStates(now int64, restore func(key string, value []byte) error) (loaded, expired int, err error) {
	start := time.Now()
	d.mu.RLock()
	if d.pdb == nil {
		d.mu.RUnlock()
		return 0, 0, ErrDBClosed
	}
	it, err := d.pdb.NewIter(&pebble.IterOptions{LowerBound: []byte{tagState}, UpperBound: []byte{tagState + 1}})
	if err != nil {
		d.mu.RUnlock()
		return 0, 0, fmt.Errorf("replication: pebble: load states: %w", err)
	}
	var dead [][]byte
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		v, verr := it.ValueAndErr()
		if verr != nil {
			err = verr
			break
		}
		if len(v) < 8 {
			err = fmt.Errorf("%w: state key %q: value %x", ErrCorrupt, k[1:], v)
			break
		}
		if int64(binary.BigEndian.Uint64(v)) <= now {
			dead = append(dead, append([]byte(nil), k...))
			continue
		}
		if err = restore(string(k[1:]), v); err != nil {
			break
		}
		loaded++
	}
	if err == nil {
		err = it.Error()
	}
	_ = it.Close()
	d.mu.RUnlock()
	if err != nil {
		return loaded, 0, fmt.Errorf("replication: pebble: load states of %s: %w", d.dir, readError(d.dir, err))
	}
	d.lastLoadNanos.Store(int64(time.Since(start)))
	d.lastLoadSlots.Store(int64(loaded))
	if len(dead) > 0 {
		d.deleteKeys(dead) // a full disk keeps them for the next load
	}
	return loaded, len(dead), nil
}

// deleteKeys deletes keys in one batch, unless the disk is full.
func (d *DB) deleteKeys(keys [][]byte) {
	_ = d.write(func(pdb *pebble.DB) error {
		b := pdb.NewBatch()
		defer b.Close()
		for _, k := range keys {
			_ = b.Delete(k, nil)
		}
		return b.Commit(pebble.NoSync) // a deletion lost in a crash is redone by the next load
	})
}

// DropExpired deletes every own and remote slot whose window has passed for
// good at now — it started two window lengths or more before now, so no
// check reads it (the sliding estimate reads the current and the previous
// window) — and every window older than twice the longest length seen
// (DropBefore, two range deletions). length tells a slot key's window
// length; keys it cannot tell are kept. It returns how many slots it
// deleted. It scans the slots still held, so call it every minute or so,
// not every flush.
func (d *DB) DropExpired(now int64, length func(key string) (time.Duration, bool)) (dropped int, err error) {
	err = d.write(func(pdb *pebble.DB) error {
		var (
			dead    [][]byte
			longest time.Duration
		)
		for _, tag := range []byte{tagOwn, tagRemote} {
			it, err := pdb.NewIter(&pebble.IterOptions{LowerBound: []byte{tag}, UpperBound: appendWindow([]byte{tag}, now)})
			if err != nil {
				return err
			}
			for valid := it.First(); valid; valid = it.Next() {
				k := it.Key()
				key, ok := slotKey(k)
				if !ok {
					continue
				}
				l, ok := length(string(key))
				if !ok {
					continue
				}
				longest = max(longest, l)
				if decodeWindow(k[1:9])+2*int64(l) <= now {
					dead = append(dead, append([]byte(nil), k...))
				}
			}
			if err := it.Close(); err != nil {
				return fmt.Errorf("drop expired windows of %s: %w", d.dir, readError(d.dir, err))
			}
		}
		if longest > 0 {
			if err := dropBefore(pdb, now-2*int64(longest)); err != nil {
				return err
			}
		}
		if len(dead) == 0 {
			return nil
		}
		b := pdb.NewBatch()
		defer b.Close()
		for _, k := range dead {
			_ = b.Delete(k, nil)
		}
		if err := b.Commit(pebble.Sync); err != nil {
			return fmt.Errorf("replication: pebble: drop %d expired slots: %w", len(dead), err)
		}
		dropped = len(dead)
		return nil
	})
	return dropped, err
}

// slotKey returns the limit key of an own or remote count key, and false for
// one too short to hold it.
func slotKey(k []byte) ([]byte, bool) {
	switch {
	case len(k) < 9:
		return nil, false
	case k[0] == tagOwn:
		return k[9:], true
	case len(k) < 10 || len(k) < 10+int(k[9]):
		return nil, false
	}
	return k[10+int(k[9]):], true
}

// Compact compacts the whole DB, so that deleted windows leave the disk now
// rather than when Pebble next compacts them; for tests and measurements.
func (d *DB) Compact() error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.pdb == nil {
		return ErrDBClosed
	}
	return d.pdb.Compact(context.Background(), []byte{0}, []byte{0xff}, true)
}
