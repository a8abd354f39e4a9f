package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// ErrDiskFull is returned, without writing anything, by every DB write while
// the filesystem of the DB's directory has less free space than
// DBOptions.MinFreeBytes (or Pebble met ENOSPC). The PoP keeps deciding from
// memory and saves again once space returns; a flush not saved is not
// published.
var ErrDiskFull = errors.New("replication: pebble: disk full")

// Defaults of DBOptions.
const (
	// DefaultMinFree is the free space below which a DB stops writing.
	DefaultMinFree = 64 << 20
	// DefaultBallast is the size of the ballast file a DB keeps.
	DefaultBallast = 16 << 20
)

// ballastName is the ballast file in a DB's directory; Pebble ignores files
// it does not know.
const ballastName = "EDGELIMIT-BALLAST"

// markerName is the save marker in a DB's directory (checkMarker).
const markerName = "EDGELIMIT-SAVED"

// Retry bounds while the disk is full: a DB looks at the free space again at
// most this often, doubling from the first to the last.
const (
	diskRetryMin = 100 * time.Millisecond
	diskRetryMax = 5 * time.Second
)

// diskGuard keeps Pebble away from ENOSPC, which Pebble answers with a panic
// in its commit pipeline (rotateWAL) or a fatal error. Before every write the
// DB asks it whether the filesystem has MinFreeBytes free; below that the
// write is refused with ErrDiskFull and Pebble is not called. Should
// something else fill the disk between that look and Pebble's write, Pebble's
// ENOSPC reaches onDiskFull (vfs.OnDiskFull), which deletes the ballast file
// so that Pebble's one retry of that write fits, and marks the disk full.
// While full, the DB looks at the free space again with a backoff (100 ms
// doubling to 5 s); when MinFreeBytes plus the ballast are free, it writes
// the ballast again and writes resume. Safe for concurrent use.
type diskGuard struct {
	fs      vfs.FS
	dir     string
	minFree int64 // <= 0: no check
	ballast int64 // <= 0: no ballast

	fullSince atomic.Int64 // unix ns when the disk was found full; 0 while not
	hitENOSPC atomic.Bool  // Pebble met ENOSPC since the last look

	mu       sync.Mutex
	reason   string    // why the disk counts as full; requires mu
	nextLook time.Time // when a full disk is looked at again; requires mu
	backoff  time.Duration
}

func newDiskGuard(fs vfs.FS, dir string, opts *DBOptions) *diskGuard {
	g := &diskGuard{fs: fs, dir: dir, minFree: opts.MinFreeBytes, ballast: opts.BallastBytes}
	if g.minFree == 0 {
		g.minFree = DefaultMinFree
	}
	if g.ballast == 0 {
		g.ballast = DefaultBallast
	}
	return g
}

// avail returns the free bytes of the filesystem, and false when it cannot
// tell (an in-memory FS in tests): then the guard checks nothing.
func (g *diskGuard) avail() (int64, bool) { return freeSpace(g.fs, g.dir) }

// freeSpace returns the free bytes of the filesystem dir is on, and false
// when fs cannot tell. Both guards, Pebble's and JetStream's, look with it.
func freeSpace(fs vfs.FS, dir string) (int64, bool) {
	u, err := fs.GetDiskUsage(dir)
	if err != nil {
		return 0, false
	}
	return int64(min(u.AvailBytes, 1<<62)), true
}

// low reports whether free space is under the minimum.
func (g *diskGuard) low() bool {
	if g.minFree <= 0 {
		return false
	}
	a, ok := g.avail()
	return ok && a < g.minFree
}

func (g *diskGuard) hasBallast() bool {
	_, err := g.fs.Stat(g.fs.PathJoin(g.dir, ballastName))
	return err == nil
}

// exists reports whether the directory already holds a Pebble store.
func (g *diskGuard) exists() bool {
	_, err := g.fs.Stat(g.fs.PathJoin(g.dir, "CURRENT"))
	if err == nil {
		return true
	}
	ls, _ := g.fs.List(g.dir)
	for _, n := range ls {
		if len(n) > 9 && n[:9] == "MANIFEST-" {
			return true
		}
	}
	return false
}

// refill writes the ballast file if it is missing and there is room for it
// above the minimum. It reports whether the ballast is in place (or none is
// wanted).
func (g *diskGuard) refill() bool {
	if g.ballast <= 0 || g.hasBallast() {
		return true
	}
	if a, ok := g.avail(); ok && a < g.minFree+g.ballast {
		return false
	}
	name := g.fs.PathJoin(g.dir, ballastName)
	tmp := name + ".tmp"
	f, err := g.fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return false
	}
	buf := make([]byte, 1<<20)
	err = nil
	for left := g.ballast; left > 0 && err == nil; left -= int64(len(buf)) {
		_, err = f.Write(buf[:min(left, int64(len(buf)))])
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = g.fs.Rename(tmp, name)
	}
	if err != nil {
		_ = g.fs.Remove(tmp)
		return false
	}
	return true
}

// onDiskFull is vfs.OnDiskFull's callback: Pebble met ENOSPC. It deletes
// the ballast so that Pebble's retry of the write fits, and marks the disk
// full. Pebble's writes wait while it runs: it does no more than that.
func (g *diskGuard) onDiskFull() {
	_ = g.fs.Remove(g.fs.PathJoin(g.dir, ballastName))
	g.hitENOSPC.Store(true)
}

// setFull marks the disk full for reason, if it was not already.
func (g *diskGuard) setFull(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fullSince.Load() != 0 {
		return
	}
	g.reason = reason
	g.backoff = diskRetryMin
	g.nextLook = time.Now().Add(g.backoff)
	g.fullSince.Store(time.Now().UnixNano())
}

// full returns why the disk counts as full, or nil.
func (g *diskGuard) full() error {
	if g.fullSince.Load() == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return fmt.Errorf("%w: %s (%s, free space under %d MiB; writes resume when %d MiB are free)",
		ErrDiskFull, g.reason, g.dir, g.minFree>>20, (g.minFree+max(g.ballast, 0))>>20)
}

// check decides whether a write may go on: it marks the disk full when it
// finds it so, and while full looks again (with backoff) whether space came
// back, refilling the ballast then. It returns nil when the write may go on,
// and whether the disk just came back (the caller may have to reopen).
func (g *diskGuard) check() (back bool, err error) {
	if g.hitENOSPC.Swap(false) {
		g.setFull("pebble met ENOSPC; the ballast was deleted to let it finish the write")
	}
	if g.fullSince.Load() == 0 {
		if g.low() {
			g.setFull("free space under the minimum")
			return false, g.full()
		}
		return false, nil
	}
	g.mu.Lock()
	if time.Now().Before(g.nextLook) {
		g.mu.Unlock()
		return false, g.full()
	}
	g.backoff = min(2*g.backoff, diskRetryMax)
	g.nextLook = time.Now().Add(g.backoff)
	g.mu.Unlock()
	if a, ok := g.avail(); (ok && a < g.minFree+max(g.ballast, 0)) || !g.refill() {
		return false, g.full()
	}
	g.fullSince.Store(0)
	return true, nil
}

// writable returns nil when a write may go to Pebble, reopening the DB
// read-write when it was opened read-only on a full disk and space has come
// back. Requires wmu held, mu not held.
func (d *DB) writable() error {
	back, err := d.guard.check()
	if err != nil {
		return err
	}
	if !back {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pdb == nil || !d.readOnly {
		return nil
	}
	_ = d.pdb.Close()
	pdb, err := d.open(false)
	if err != nil {
		d.pdb = nil // closed: every call returns ErrDBClosed from now on
		return fmt.Errorf("replication: pebble: reopen read-write after the disk was full: %w", err)
	}
	d.pdb, d.readOnly = pdb, false
	return nil
}

// DiskFull returns why the DB is not writing, ErrDiskFull wrapped with the
// reason, or nil when it writes. It does not look at the disk: a write does.
func (d *DB) DiskFull() error { return d.guard.full() }

// Damaged returns ErrCorrupt naming the first damaged file Pebble reported
// since OpenDB (a table that fails its checksum when read or compacted), or
// nil. The PoP goes on deciding from memory; its next start refuses.
func (d *DB) Damaged() error {
	if p := d.damaged.Load(); p != nil {
		return fmt.Errorf("%w: %s. %s", ErrCorrupt, *p, recoveryHint(d.dir))
	}
	return nil
}

// commitSave commits b, one save, with the save count raised by one, then
// writes the save marker. Requires wmu held and mu held for reading.
func (d *DB) commitSave(b *pebble.Batch) error {
	_ = b.Set(keySaves, binary.AppendUvarint(nil, d.saves+1), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return err
	}
	d.saves++
	if err := d.writeMarker(d.saves); err != nil {
		// The marker only lags: a restart checks less, never wrongly.
		d.markerErrors.Add(1)
	}
	return nil
}

// The save marker is a 16-byte file beside Pebble's, rewritten in place and
// synced after every save that committed: the save count, then its bitwise
// complement. Pebble tolerates a damaged last record of its WAL as a write
// torn by a crash, and drops it; a restart that finds fewer saves in Pebble
// than the marker says were on disk knows the WAL lost saves it had synced
// (a flipped byte, not a crash), and refuses to start lower than it was.
func (d *DB) writeMarker(saves uint64) error {
	name := d.guard.fs.PathJoin(d.dir, markerName)
	f, err := d.guard.fs.OpenReadWrite(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	var buf [16]byte
	binary.BigEndian.PutUint64(buf[:8], saves)
	binary.BigEndian.PutUint64(buf[8:], ^saves)
	_, err = f.WriteAt(buf[:], 0)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// checkMarker compares the save count Pebble recovered with the marker's. A
// missing marker (a directory from before markers, or a crash before the
// first save) checks nothing.
func (d *DB) checkMarker(saves uint64) error {
	name := d.guard.fs.PathJoin(d.dir, markerName)
	f, err := d.guard.fs.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("save marker %s: %w", name, err)
	}
	defer f.Close()
	var buf [16]byte
	n, err := io.ReadFull(f, buf[:])
	if n == 0 && (err == io.EOF || err == io.ErrUnexpectedEOF) {
		return nil // created, never written: a crash before the first save
	}
	marked, check := binary.BigEndian.Uint64(buf[:8]), binary.BigEndian.Uint64(buf[8:])
	if err != nil || marked != ^check {
		return fmt.Errorf("%w: save marker %s is damaged (%x). %s", ErrCorrupt, name, buf[:n], recoveryHint(d.dir))
	}
	if saves < marked {
		var wals []string
		ls, _ := d.guard.fs.List(d.dir)
		for _, n := range ls {
			if strings.HasSuffix(n, ".log") {
				wals = append(wals, d.guard.fs.PathJoin(d.dir, n))
			}
		}
		return fmt.Errorf("%w: damaged write-ahead log (%s): it lost saves it had on disk: Pebble recovered %d saves, the marker %s records %d "+
			"(Pebble took the damage for a write torn by a crash). %s", ErrCorrupt, strings.Join(wals, ", "), saves, name, marked, recoveryHint(d.dir))
	}
	return nil
}

// recoveryHint is the way out of a damaged data directory, as docs/durability.md
// documents it.
func recoveryHint(dir string) string {
	return fmt.Sprintf("The PoP does not start on damaged state, which would count and publish less than it did. "+
		"To start, move the directory aside (mv %s %s.damaged) and start again: see docs/durability.md for what that costs", dir, dir)
}

// openError explains a failed pebble.Open: a damaged WAL, table or MANIFEST
// is ErrCorrupt with the file Pebble names and the way out.
func openError(dir string, err error) error {
	if pebble.IsCorruptionError(err) || isManifestError(err) {
		return fmt.Errorf("replication: pebble: open %s: %w: %s. %s", dir, ErrCorrupt, firstLine(err), recoveryHint(dir))
	}
	return fmt.Errorf("replication: pebble: open %s: %w", dir, err)
}

// isManifestError reports whether err comes from reading a MANIFEST or its
// CURRENT pointer, which Pebble does not always mark as corruption.
func isManifestError(err error) bool {
	s := err.Error()
	for _, w := range []string{"MANIFEST", "manifest", "CURRENT", "version edit"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// readError marks a damaged table met while reading dir as ErrCorrupt, with
// the way out.
func readError(dir string, err error) error {
	if pebble.IsCorruptionError(err) {
		return fmt.Errorf("%w: %s. %s", ErrCorrupt, firstLine(err), recoveryHint(dir))
	}
	return err
}

// firstLine is err's message without the detail lines Pebble's errors carry.
func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}
