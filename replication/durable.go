package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/edgelimit/edgelimit/crdt"
)

// Errors returned by DB. Each is wrapped with the values involved; test with
// errors.Is.
var (
	// ErrDBClosed is returned by every DB method called after Close.
	ErrDBClosed = errors.New("replication: pebble: DB closed")
	// ErrReplicaMismatch is returned by OpenDB when the directory holds the
	// state of another replica, and by SaveFlush when an own slot names a
	// replica other than the DB's. Restoring another PoP's counts as this
	// PoP's own would publish them under the wrong name; starting from
	// nothing would publish values lower than before.
	ErrReplicaMismatch = errors.New("replication: pebble: replica mismatch")
	// ErrCorrupt is returned when a stored key or value cannot be decoded,
	// or the directory was written in an unknown format version.
	ErrCorrupt = errors.New("replication: pebble: corrupt state")
)

// Key layout. Every key starts with a one-byte tag; count keys then carry the
// window, so that a window range is a key range (DropBefore is two range
// deletions) and Load reads each window's slots together:
//
//	'm' name                                      -> metadata (below)
//	'o' window(8) key                             -> own count, uvarint
//	'r' window(8) len(replica)(1) replica key     -> remote count, uvarint
//	's' key                                       -> saved state: expiry(8) then the store's bytes (states.go)
//	'l' id(16)                                    -> a concurrency lease's slots and expiries (leases.go)
//
// window(8) is the window as big-endian uint64 with the sign bit flipped, so
// byte order is numeric order, negative windows included. Count values are
// written with Pebble's Merge under maxMerger, so a stored count is the
// maximum of every value ever written for its key.
const (
	tagMeta   = 'm'
	tagOwn    = 'o'
	tagRemote = 'r'
	tagState  = 's' // saved states, states.go

	signBit = 1 << 63

	// maxReplicaLen is the longest remote replica name a key can carry.
	maxReplicaLen = math.MaxUint8

	// dbFormat is the format version recorded in a new directory: 2 adds
	// saved states ('s' keys, SaveStates) and the save count. A format 1
	// directory opens and is recorded as 2 once written.
	dbFormat = 2
)

var (
	keyReplica = []byte("m/replica") // the replica whose own counts the DB holds
	keySeq     = []byte("m/seq")     // stream position, 8 bytes big-endian
	keyFormat  = []byte("m/format")  // format version, uvarint
	keySaves   = []byte("m/saves")   // saves committed (SaveFlush, SaveStates), uvarint; see saveMarker
)

// DBOptions tunes OpenDB. The zero value (or nil) gives the defaults.
type DBOptions struct {
	// FS is the filesystem Pebble runs on; nil means the operating system's.
	// Tests pass vfs.NewCrashableMem() to simulate a power loss.
	FS vfs.FS
	// CacheSize is Pebble's block cache in bytes; 0 means Pebble's default
	// (8 MiB). Load reads every block once, so a larger cache does not speed
	// up a restart.
	CacheSize int64
	// Logger receives Pebble's log lines (WAL recovery, background errors);
	// nil means Pebble's default, the standard library's log package.
	Logger pebble.Logger
	// MinFreeBytes is the free space the DB leaves on its filesystem: below
	// it, writes stop with ErrDiskFull before Pebble runs out of space (which
	// Pebble survives only by crashing). 0 means DefaultMinFree; negative
	// turns the check off.
	MinFreeBytes int64
	// BallastBytes is the size of a file the DB keeps in its directory and
	// deletes when Pebble meets ENOSPC anyway, so that Pebble's write is
	// retried into that room rather than crash. 0 means DefaultBallast;
	// negative keeps none.
	BallastBytes int64
}

// DB is a PoP's durable state in a Pebble directory: its own counts (one
// replica's crdt.Local), the merged counts of remote replicas, and the stream
// position up to which remote batches were applied. A driver writes it once
// per flush interval with SaveFlush and reads it back with Load after a
// restart.
//
// The contract that keeps published values monotone across a crash:
//
//  1. Every flush interval the driver takes own := Local.Delta(), calls
//     SaveFlush(own, remoteApplied, seq), and publishes own only after
//     SaveFlush returned nil. SaveFlush is one atomic, synced Pebble batch:
//     after a crash (kill -9 or power loss) either all of it is on disk or
//     none of it is.
//  2. On restart the driver calls Load and, before the first Add or Delta,
//     Local.Restore(own), Counters.Join(remote...), and resumes the stream
//     after seq. Restore marks the restored slots for the next Delta, so a
//     flush that was saved but perhaps not published is published again.
//
// What a crash loses is exactly the own hits counted after the last SaveFlush
// that returned nil (at most one flush interval of hits, never published, so
// no other PoP saw them), and the remote slots applied since that flush (the
// stream redelivers them from seq, and joining them again is harmless). A
// SaveFlush in progress at the crash is durable entirely or not at all.
//
// Stored counts only rise: SaveFlush merges each value into the maximum of
// everything written for its slot, so a stale or reordered batch cannot lower
// one. DropBefore deletes whole windows.
//
// Use OpenDB; a zero DB behaves as a closed one. A DB is safe for concurrent
// use. Close waits for calls in progress; every call after Close returns
// ErrDBClosed.
type DB struct {
	replica string
	dir     string
	opts    DBOptions
	guard   *diskGuard

	wmu   sync.Mutex // serializes writes: a save's count and its marker go in order
	saves uint64     // saves committed; requires wmu (or no other call, in OpenDB)

	mu       sync.RWMutex // held for reading by every call, for writing by Close and a reopen
	pdb      *pebble.DB   // nil once closed (and in a zero DB); requires mu
	readOnly bool         // opened read-only on a full disk; requires mu

	flushes        atomic.Uint64
	lastFlushNanos atomic.Int64
	lastFlushSlots atomic.Int64
	lastLoadNanos  atomic.Int64
	lastLoadSlots  atomic.Int64
	markerErrors   atomic.Uint64
	damaged        atomic.Pointer[string] // the first damaged file Pebble reported
}

// DBStats is a snapshot of a DB's size and recent timings, for metrics.
type DBStats struct {
	DiskBytes      uint64        // bytes Pebble uses on disk (tables, WAL, manifests)
	Flushes        uint64        // SaveFlush calls that succeeded since OpenDB
	LastFlush      time.Duration // duration of the last successful SaveFlush, sync included
	LastFlushSlots int           // slots written by the last successful SaveFlush
	LastLoad       time.Duration // duration of the last successful Load
	LastLoadSlots  int           // slots returned by the last successful Load
}

// maxMerger resolves Pebble merge operands of a count key to their maximum.
// Max is associative and commutative, so compactions may merge any subset of
// operands. Its name is recorded in the directory: Pebble refuses to open a
// directory written with another merger.
var maxMerger = &pebble.Merger{
	Name: "edgelimit.max_uvarint.v1",
	Merge: func(key, value []byte) (pebble.ValueMerger, error) {
		n, err := decodeCount(value)
		if err != nil {
			return nil, fmt.Errorf("%w: merge key %x: %w", ErrCorrupt, key, err)
		}
		return &maxValue{n: n}, nil
	},
}

// maxValue is a pebble.ValueMerger holding the largest count seen so far.
type maxValue struct {
	n   uint64
	buf [binary.MaxVarintLen64]byte
}

func (m *maxValue) MergeNewer(value []byte) error { return m.merge(value) }
func (m *maxValue) MergeOlder(value []byte) error { return m.merge(value) }

func (m *maxValue) merge(value []byte) error {
	n, err := decodeCount(value)
	if err != nil {
		return fmt.Errorf("%w: merge operand: %w", ErrCorrupt, err)
	}
	m.n = max(m.n, n)
	return nil
}

func (m *maxValue) Finish(includesBase bool) ([]byte, io.Closer, error) {
	return binary.AppendUvarint(m.buf[:0], m.n), nil, nil
}

// OpenDB opens the durable state of replica in dir, creating the directory
// and an empty state if missing. replica is "" for a PoP that does not
// replicate: its directory holds only saved states (SaveStates), and a PoP
// given a replica name later adopts it. OpenDB fails with ErrReplicaMismatch
// when dir holds another replica's state, with ErrCorrupt — naming the
// damaged file and the way out (ErrCorrupt's message, docs/durability.md)
// — when Pebble finds a damaged WAL, table or MANIFEST, when the WAL lost
// saves that were on disk (the save marker, saveMarker), or when dir was
// written in an unknown format. On a disk already full (less free than
// MinFreeBytes and no ballast left) it opens dir read-only: Load works, and
// the DB reports DiskFull until space returns (see diskGuard). opts may be
// nil.
func OpenDB(dir, replica string, opts *DBOptions) (*DB, error) {
	if opts == nil {
		opts = &DBOptions{}
	}
	fs := opts.FS
	if fs == nil {
		fs = vfs.Default
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("replication: pebble: create %s: %w", dir, err)
	}
	d := &DB{replica: replica, dir: dir, opts: *opts, guard: newDiskGuard(fs, dir, opts)}
	readOnly := d.guard.low() && !d.guard.hasBallast() && d.guard.exists()
	pdb, err := d.open(readOnly)
	if err != nil {
		return nil, err
	}
	d.pdb = pdb
	if readOnly {
		d.readOnly = true
		d.guard.setFull("disk full at start: opened read-only")
	} else {
		d.guard.refill()
	}
	return d, nil
}

// open opens the Pebble store in d.dir and checks its metadata and save
// marker. Requires d.pdb nil or closed, and no other call in progress.
func (d *DB) open(readOnly bool) (*pebble.DB, error) {
	po := &pebble.Options{
		Merger:             maxMerger,
		FS:                 vfs.OnDiskFull(d.guard.fs, d.guard.onDiskFull),
		CacheSize:          d.opts.CacheSize,
		Logger:             d.opts.Logger,
		FormatMajorVersion: pebble.FormatNewest,
		ReadOnly:           readOnly,
		EventListener: &pebble.EventListener{
			// Pebble's default exits the process; the read that found the
			// damage returns it too, and the DB reports it (Damaged).
			DataCorruption: func(info pebble.DataCorruptionInfo) {
				path := info.Path
				d.damaged.CompareAndSwap(nil, &path)
				if d.opts.Logger != nil {
					d.opts.Logger.Errorf("damaged file %s: %v", info.Path, info.Details)
				}
			},
		},
	}
	pdb, err := pebble.Open(d.dir, po)
	if err != nil {
		return nil, openError(d.dir, err)
	}
	saves, err := initMeta(pdb, d.replica, readOnly)
	if err == nil {
		err = d.checkMarker(saves)
	}
	if err != nil {
		_ = pdb.Close() // the metadata error is the one to report
		if p := d.damaged.Load(); p != nil {
			err = fmt.Errorf("damaged file %s: %w", *p, err)
		}
		return nil, fmt.Errorf("replication: pebble: open %s: %w", d.dir, readError(d.dir, err))
	}
	d.saves = saves
	return pdb, nil
}

// initMeta checks that pdb holds replica's state in a known format, or
// records both in a new (empty) pdb, and returns the number of saves
// recorded. A directory of a PoP without a replica name ("") is adopted by
// a named one (it holds no own slots); a named one is not opened unnamed.
// readOnly checks without writing.
func initMeta(pdb *pebble.DB, replica string, readOnly bool) (saves uint64, err error) {
	stored, ok, err := get(pdb, keyReplica)
	if err != nil {
		return 0, err
	}
	if ok && string(stored) != replica && len(stored) > 0 {
		return 0, fmt.Errorf("%w: directory holds replica %q, opened as %q", ErrReplicaMismatch, stored, replica)
	}
	if ok {
		f, _, err := get(pdb, keyFormat)
		if err != nil {
			return 0, err
		}
		if v, err := decodeCount(f); err != nil || (v != 1 && v != dbFormat) {
			return 0, fmt.Errorf("%w: format %x, want 1 or %d", ErrCorrupt, f, dbFormat)
		}
		if n, ok, err := get(pdb, keySaves); err != nil {
			return 0, err
		} else if ok {
			if saves, err = decodeCount(n); err != nil {
				return 0, fmt.Errorf("%w: save count: %w", ErrCorrupt, err)
			}
		}
	}
	if readOnly || (ok && string(stored) == replica && saves > 0) {
		return saves, nil
	}
	b := pdb.NewBatch()
	defer b.Close()
	_ = b.Set(keyReplica, []byte(replica), nil) // a batch Set only fails on a closed batch
	_ = b.Set(keyFormat, binary.AppendUvarint(nil, dbFormat), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return 0, fmt.Errorf("record replica %q: %w", replica, err)
	}
	return saves, nil
}

// get returns a copy of key's value, and whether key exists.
func get(pdb *pebble.DB, key []byte) ([]byte, bool, error) {
	v, closer, err := pdb.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("get %q: %w", key, err)
	}
	out := append([]byte(nil), v...)
	if err := closer.Close(); err != nil {
		return nil, false, fmt.Errorf("get %q: %w", key, err)
	}
	return out, true, nil
}

// Replica returns the name of the replica whose own counts d holds.
func (d *DB) Replica() string { return d.replica }

// SaveFlush durably records one flush in one atomic, synced batch: own, this
// replica's slots about to be published (absolute counts, as Local.Delta
// returns them); remote, other replicas' slots applied since the last flush
// (or all of them: rewriting a slot costs a key, not a wrong count); and
// streamSeq, the stream position up to which remote batches were applied.
// It returns once the batch is on disk; publish own only after it returned
// nil.
//
// Each count is raised to the maximum of what is stored and what is given;
// slots with a zero count are skipped, and so are remote slots of d's own
// replica (as Counts.Apply ignores them). streamSeq is stored as given, not
// maxed: it is a cursor, and a stream recreated from sequence 1 must be able
// to move it back. Pass the position reached even when no remote slot
// changed.
//
// SaveFlush fails, writing nothing, with ErrReplicaMismatch when an own slot
// names another replica, and with an error naming the slot when a remote
// replica name is longer than 255 bytes. When it fails for any reason the driver must not publish own, and
// must save those slots again with a later flush: Local.Delta already
// cleared them from its changed set.
func (d *DB) SaveFlush(own, remote []crdt.Slot, streamSeq uint64) error {
	return d.write(func(pdb *pebble.DB) error { return d.saveFlush(pdb, own, remote, streamSeq) })
}

// write runs f, one write, with the Pebble store: writes go one at a time
// (wmu), only while the disk is writable (ErrDiskFull otherwise), and never
// after Close (ErrDBClosed).
func (d *DB) write(f func(pdb *pebble.DB) error) error {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if err := d.writable(); err != nil {
		return err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.pdb == nil {
		return ErrDBClosed
	}
	return f(d.pdb)
}

// saveFlush is SaveFlush's work; requires write's locks.
func (d *DB) saveFlush(pdb *pebble.DB, own, remote []crdt.Slot, streamSeq uint64) error {
	start := time.Now()
	size := 32
	for _, s := range own {
		if s.Replica != d.replica {
			return fmt.Errorf("%w: save own slot %v in the DB of replica %q", ErrReplicaMismatch, s, d.replica)
		}
		size += 24 + len(s.Key)
	}
	for _, s := range remote {
		if len(s.Replica) > maxReplicaLen {
			return fmt.Errorf("replication: pebble: save remote slot %v: replica name of %d bytes, at most %d",
				s, len(s.Replica), maxReplicaLen)
		}
		size += 24 + len(s.Key) + len(s.Replica)
	}

	b := pdb.NewBatchWithSize(size)
	defer b.Close()
	var (
		key   []byte
		val   [binary.MaxVarintLen64]byte
		slots int
	)
	// Batch Merge and Set copy their arguments and fail only on a closed or
	// read-only batch, so their errors are ignored here; Commit reports any.
	for _, s := range own {
		if s.Count == 0 {
			continue
		}
		key = appendOwnKey(key[:0], s.Window, s.Key)
		_ = b.Merge(key, binary.AppendUvarint(val[:0], s.Count), nil)
		slots++
	}
	for _, s := range remote {
		if s.Count == 0 || s.Replica == d.replica {
			continue
		}
		key = appendRemoteKey(key[:0], s.Window, s.Replica, s.Key)
		_ = b.Merge(key, binary.AppendUvarint(val[:0], s.Count), nil)
		slots++
	}
	_ = b.Set(keySeq, binary.BigEndian.AppendUint64(val[:0], streamSeq), nil)
	if err := d.commitSave(b); err != nil {
		return fmt.Errorf("replication: pebble: save flush of %d own and %d remote slots, seq %d: %w",
			len(own), len(remote), streamSeq, err)
	}
	d.flushes.Add(1)
	d.lastFlushNanos.Store(int64(time.Since(start)))
	d.lastFlushSlots.Store(int64(slots))
	return nil
}

// Load returns everything d holds, for a restart: own slots in
// crdt.CompareSlots order, remote slots ordered by window, replica, then key,
// and the stream position of the last SaveFlush (0 if none). The slices are
// new; the caller owns them. Load reads with one iterator over a consistent
// view, so a concurrent SaveFlush is seen entirely or not at all.
func (d *DB) Load() (own, remote []crdt.Slot, streamSeq uint64, err error) {
	start := time.Now()
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.pdb == nil {
		return nil, nil, 0, ErrDBClosed
	}
	it, err := d.pdb.NewIter(nil)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("replication: pebble: load: %w", err)
	}
	own, remote, streamSeq, err = d.load(it)
	if cerr := it.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("replication: pebble: load %s: %w", d.dir, readError(d.dir, err))
	}
	d.lastLoadNanos.Store(int64(time.Since(start)))
	d.lastLoadSlots.Store(int64(len(own) + len(remote)))
	return own, remote, streamSeq, nil
}

// sizeHint estimates, cheaply, how many slots Load will return: the entries
// of the fullest LSM level, where each key appears at most once (it ignores
// the memtables). It returns 0 when the table properties cannot be read.
// Requires d.mu held for reading.
func (d *DB) sizeHint() int {
	levels, err := d.pdb.SSTables(pebble.WithProperties())
	if err != nil {
		return 0 // only a hint: Load grows its slices as it goes
	}
	hint := uint64(0)
	for _, tables := range levels {
		n := uint64(0)
		for _, t := range tables {
			if t.Properties != nil {
				n += t.Properties.NumEntries
			}
		}
		hint = max(hint, n)
	}
	return int(min(hint, 1<<28))
}

// load decodes every entry of it. Requires d.mu held for reading.
func (d *DB) load(it *pebble.Iterator) (own, remote []crdt.Slot, streamSeq uint64, err error) {
	replicas := make(map[string]string) // interned remote replica names
	// One backing array for both: own keys sort before remote ones.
	all := make([]crdt.Slot, 0, d.sizeHint())
	nOwn := 0
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		if len(k) > 0 && k[0] == tagLease {
			// Leases are LoadLeases'; skip them all at once.
			if valid = it.SeekGE([]byte{tagLease + 1}); !valid {
				break
			}
			k = it.Key()
		}
		if len(k) > 0 && k[0] == tagState {
			// Saved states are LoadStates'; skip them all at once.
			if valid = it.SeekGE([]byte{tagState + 1}); !valid {
				break
			}
			k = it.Key()
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, nil, 0, fmt.Errorf("key %x: %w", k, err)
		}
		if len(k) == 0 {
			return nil, nil, 0, fmt.Errorf("%w: empty key", ErrCorrupt)
		}
		switch k[0] {
		case tagMeta:
			if string(k) == string(keySeq) {
				if len(v) != 8 {
					return nil, nil, 0, fmt.Errorf("%w: stream position %x", ErrCorrupt, v)
				}
				streamSeq = binary.BigEndian.Uint64(v)
			}
		case tagOwn:
			if len(k) < 9 {
				return nil, nil, 0, fmt.Errorf("%w: own key %x", ErrCorrupt, k)
			}
			n, err := decodeCount(v)
			if err != nil {
				return nil, nil, 0, fmt.Errorf("%w: own key %x: %w", ErrCorrupt, k, err)
			}
			all = append(all, crdt.Slot{Key: string(k[9:]), Window: decodeWindow(k[1:9]), Replica: d.replica, Count: n})
			nOwn++
		case tagRemote:
			if len(k) < 10 || len(k) < 10+int(k[9]) {
				return nil, nil, 0, fmt.Errorf("%w: remote key %x", ErrCorrupt, k)
			}
			n, err := decodeCount(v)
			if err != nil {
				return nil, nil, 0, fmt.Errorf("%w: remote key %x: %w", ErrCorrupt, k, err)
			}
			rb := k[10 : 10+int(k[9])]
			r, ok := replicas[string(rb)]
			if !ok {
				r = string(rb)
				replicas[r] = r
			}
			all = append(all, crdt.Slot{Key: string(k[10+len(rb):]), Window: decodeWindow(k[1:9]), Replica: r, Count: n})
		default:
			return nil, nil, 0, fmt.Errorf("%w: unknown key %x", ErrCorrupt, k)
		}
	}
	if err := it.Error(); err != nil {
		return nil, nil, 0, err
	}
	if nOwn > 0 {
		own = all[:nOwn:nOwn] // full: appending to own copies, never overwrites remote
	}
	if len(all) > nOwn {
		remote = all[nOwn:]
	}
	return own, remote, streamSeq, nil
}

// DropBefore deletes, durably, every own and remote slot of a window that
// starts before window: two range deletions in one synced batch, whatever
// the number of slots. It does not stop a later SaveFlush from writing such a
// window again; the next DropBefore deletes it with the rest.
func (d *DB) DropBefore(window int64) error {
	return d.write(func(pdb *pebble.DB) error { return dropBefore(pdb, window) })
}

// dropBefore is DropBefore's work; requires write's locks.
func dropBefore(pdb *pebble.DB, window int64) error {
	if window == math.MinInt64 {
		return nil // no window starts before it
	}
	b := pdb.NewBatch()
	defer b.Close()
	for _, tag := range []byte{tagOwn, tagRemote} {
		start := []byte{tag}
		end := appendWindow([]byte{tag}, window)
		_ = b.DeleteRange(start, end, nil) // fails only on a closed batch; Commit reports any error
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("replication: pebble: drop windows before %d: %w", window, err)
	}
	return nil
}

// Stats returns d's size on disk and the timings of its last flush and load.
// After Close, DiskBytes is zero.
func (d *DB) Stats() DBStats {
	s := DBStats{
		Flushes:        d.flushes.Load(),
		LastFlush:      time.Duration(d.lastFlushNanos.Load()),
		LastFlushSlots: int(d.lastFlushSlots.Load()),
		LastLoad:       time.Duration(d.lastLoadNanos.Load()),
		LastLoadSlots:  int(d.lastLoadSlots.Load()),
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.pdb != nil {
		s.DiskBytes = d.pdb.Metrics().DiskSpaceUsage()
	}
	return s
}

// Close waits for calls in progress, flushes Pebble's memtable to a table
// (so that the next OpenDB need not replay the write-ahead log: a clean
// restart is faster than one after a crash) and closes the Pebble store.
// Everything SaveFlush and DropBefore returned nil for was on disk already;
// an error from Close loses none of it. A second Close returns ErrDBClosed.
func (d *DB) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pdb == nil {
		return ErrDBClosed
	}
	pdb := d.pdb
	d.pdb = nil
	var ferr error
	if !d.readOnly && d.guard.full() == nil {
		ferr = pdb.Flush() // an optimization: close even if it fails; never on a full disk
	}
	if err := errors.Join(ferr, pdb.Close()); err != nil {
		return fmt.Errorf("replication: pebble: close %s: %w", d.dir, err)
	}
	return nil
}

// appendWindow appends w as 8 big-endian bytes with the sign bit flipped, so
// that byte order is numeric order.
func appendWindow(dst []byte, w int64) []byte {
	return binary.BigEndian.AppendUint64(dst, uint64(w)^signBit)
}

// decodeWindow inverts appendWindow. Requires len(b) >= 8.
func decodeWindow(b []byte) int64 {
	return int64(binary.BigEndian.Uint64(b) ^ signBit)
}

func appendOwnKey(dst []byte, window int64, key string) []byte {
	dst = appendWindow(append(dst, tagOwn), window)
	return append(dst, key...)
}

// appendRemoteKey requires len(replica) <= maxReplicaLen.
func appendRemoteKey(dst []byte, window int64, replica, key string) []byte {
	dst = appendWindow(append(dst, tagRemote), window)
	dst = append(dst, byte(len(replica)))
	dst = append(dst, replica...)
	return append(dst, key...)
}

// decodeCount decodes a count value: one uvarint filling b.
func decodeCount(b []byte) (uint64, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || k != len(b) {
		return 0, fmt.Errorf("count value %x is not one uvarint", b)
	}
	return n, nil
}
