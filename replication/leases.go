package replication

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Concurrency leases granted by the embedded store are kept here so that a
// restarted PoP knows the slots its clients still hold (see
// docs/durability-leases.md). One record per lease:
//
//	'l' id(16) -> n × (slot key(16), expiry(8, unix ns, big-endian))
//
// SaveLease is synced before the grant is answered; ForgetLease is not (a
// release lost in a crash only keeps its slot taken until the lease's
// expiry).
const (
	tagLease     = 'l'
	leaseIDLen   = 16
	leaseItemLen = 16 + 8
)

// SaveLease durably records that lease id holds a slot in each set of keys
// until the matching expiry of exps (unix ns): one synced write, which
// Pebble's commit pipeline groups with the writes of concurrent grants. It
// does not wait for other saves (SaveFlush, SaveStates). It fails with
// ErrDiskFull while the disk is full, and with an error naming the lease
// when keys and exps differ in length or an id or key is not 16 bytes.
func (d *DB) SaveLease(id []byte, keys [][]byte, exps []int64) error {
	if len(id) != leaseIDLen || len(keys) != len(exps) {
		return fmt.Errorf("replication: pebble: save lease %x: id of %d bytes, %d keys, %d expiries", id, len(id), len(keys), len(exps))
	}
	v := make([]byte, 0, len(keys)*leaseItemLen)
	for i, k := range keys {
		if len(k) != 16 {
			return fmt.Errorf("replication: pebble: save lease %x: slot key %x of %d bytes, want 16", id, k, len(k))
		}
		v = binary.BigEndian.AppendUint64(append(v, k...), uint64(exps[i]))
	}
	if err := d.guard.full(); err != nil {
		return err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.pdb == nil {
		return ErrDBClosed
	}
	if d.readOnly {
		return fmt.Errorf("%w: opened read-only", ErrDiskFull)
	}
	if err := d.pdb.Set(leaseKey(id), v, pebble.Sync); err != nil {
		return fmt.Errorf("replication: pebble: save lease %x: %w", id, err)
	}
	return nil
}

// ForgetLease deletes lease id's record, unsynced. It does nothing while the
// disk is full or after Close: the record then outlives the lease until
// LoadLeases or DropExpiredLeases finds it expired.
func (d *DB) ForgetLease(id []byte) {
	if d.guard.full() != nil {
		return
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.pdb == nil || d.readOnly {
		return
	}
	_ = d.pdb.Delete(leaseKey(id), pebble.NoSync)
}

// LoadLeases calls restore with every saved lease holding at least one slot
// not expired at now (restore must copy what it keeps), and deletes the
// leases expired at now (unless the disk is full). It returns how many it
// restored and deleted; a record that does not decode is ErrCorrupt naming
// it.
func (d *DB) LoadLeases(now int64, restore func(id []byte, keys [][]byte, exps []int64)) (loaded, expired int, err error) {
	loaded, dead, err := d.scanLeases(now, restore)
	if err != nil {
		return 0, 0, fmt.Errorf("replication: pebble: load leases of %s: %w", d.dir, readError(d.dir, err))
	}
	if len(dead) > 0 {
		d.deleteKeys(dead) // a full disk keeps them for the next look
	}
	return loaded, len(dead), nil
}

// DropExpiredLeases deletes the records of leases every slot of which has
// expired at now (leases that were never released), and returns how many.
// It scans every lease record, so call it every lease TTL or so, not on
// every grant.
func (d *DB) DropExpiredLeases(now int64) (int, error) {
	_, dead, err := d.scanLeases(now, nil)
	if err != nil {
		return 0, fmt.Errorf("replication: pebble: drop expired leases of %s: %w", d.dir, readError(d.dir, err))
	}
	if len(dead) > 0 {
		d.deleteKeys(dead)
	}
	return len(dead), nil
}

// scanLeases reads every lease record: those with a slot live at now go to
// live (when not nil), the keys of the others are returned.
func (d *DB) scanLeases(now int64, live func(id []byte, keys [][]byte, exps []int64)) (n int, dead [][]byte, err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.pdb == nil {
		return 0, nil, ErrDBClosed
	}
	it, err := d.pdb.NewIter(&pebble.IterOptions{LowerBound: []byte{tagLease}, UpperBound: []byte{tagLease + 1}})
	if err != nil {
		return 0, nil, err
	}
	var keys [][]byte
	var exps []int64
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		v, verr := it.ValueAndErr()
		if verr != nil {
			err = verr
			break
		}
		if len(k) != 1+leaseIDLen || len(v) == 0 || len(v)%leaseItemLen != 0 {
			err = fmt.Errorf("%w: lease key %x: value of %d bytes", ErrCorrupt, k, len(v))
			break
		}
		keys, exps = keys[:0], exps[:0]
		alive := false
		for off := 0; off < len(v); off += leaseItemLen {
			exp := int64(binary.BigEndian.Uint64(v[off+16:]))
			keys = append(keys, v[off:off+16])
			exps = append(exps, exp)
			alive = alive || exp > now
		}
		if !alive {
			dead = append(dead, append([]byte(nil), k...))
			continue
		}
		n++
		if live != nil {
			live(k[1:], keys, exps)
		}
	}
	if err == nil {
		err = it.Error()
	}
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	return n, dead, err
}

func leaseKey(id []byte) []byte {
	return append([]byte{tagLease}, id...)
}
