package replication

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/edgelimit/edgelimit/crdt"
)

const (
	durableW0 = int64(-60_000_000_000) // a window before the epoch: the encoding must order it first
	durableW1 = int64(0)
	durableW2 = int64(60_000_000_000)
)

// durableQuietLogger drops Pebble's informational lines (one per open) and
// keeps errors.
type durableQuietLogger struct{}

func (durableQuietLogger) Infof(format string, args ...any)  {}
func (durableQuietLogger) Errorf(format string, args ...any) { log.Printf(format, args...) }
func (durableQuietLogger) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }

func durableOpen(t testing.TB, dir, replica string, opts *DBOptions) *DB {
	t.Helper()
	if opts == nil {
		opts = &DBOptions{}
	}
	opts.Logger = durableQuietLogger{}
	db, err := OpenDB(dir, replica, opts)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func durableSlot(key string, window int64, replica string, n uint64) crdt.Slot {
	return crdt.Slot{Key: key, Window: window, Replica: replica, Count: n}
}

// durableLoadAll loads db and returns own and remote slots together in
// crdt.CompareSlots order, with the stream position.
func durableLoadAll(t testing.TB, db *DB) ([]crdt.Slot, uint64) {
	t.Helper()
	own, remote, seq, err := db.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range own {
		if s.Replica != db.Replica() {
			t.Fatalf("Load returned own slot %v of another replica", s)
		}
	}
	if !slices.IsSortedFunc(own, crdt.CompareSlots) {
		t.Errorf("own slots not in CompareSlots order: %v", own)
	}
	all := append(own, remote...)
	slices.SortFunc(all, crdt.CompareSlots)
	return all, seq
}

func TestDurableRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // OpenDB creates it
	db := durableOpen(t, dir, "fra1", nil)
	odd := "a\x00b\xff" // keys are bytes, not text
	flushes := []struct {
		own, remote []crdt.Slot
		seq         uint64
	}{
		{
			own:    []crdt.Slot{durableSlot("k", durableW0, "fra1", 1), durableSlot("", durableW0, "fra1", 2)},
			remote: []crdt.Slot{durableSlot("k", durableW0, "par1", 5)},
			seq:    3,
		},
		{
			own: []crdt.Slot{durableSlot("k", durableW0, "fra1", 4), durableSlot("k", durableW1, "fra1", 1)},
			remote: []crdt.Slot{
				durableSlot("k", durableW0, "par1", 7), durableSlot("k", durableW1, "ams1", 2),
				durableSlot("k", durableW1, "fra1", 99), // own replica in a remote batch: ignored
				durableSlot("z", durableW1, "ams1", 0),  // zero count: ignored
			},
			seq: 9,
		},
		{ // windows advance; a stale remote value does not lower the stored one
			own:    []crdt.Slot{durableSlot("k", durableW2, "fra1", 3), durableSlot(odd, durableW2, "fra1", 8)},
			remote: []crdt.Slot{durableSlot("k", durableW0, "par1", 6), durableSlot(odd, durableW2, "", 1)},
			seq:    12,
		},
		{own: nil, remote: nil, seq: 14}, // nothing changed but the position moved
	}
	for i, f := range flushes {
		if err := db.SaveFlush(f.own, f.remote, f.seq); err != nil {
			t.Fatalf("flush %d: %v", i, err)
		}
	}
	if st := db.Stats(); st.Flushes != 4 || st.DiskBytes == 0 || st.LastFlush <= 0 || st.LastFlushSlots != 0 {
		t.Errorf("Stats() = %+v, want 4 flushes, some disk bytes, last flush of 0 slots", st)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	want := []crdt.Slot{
		durableSlot("", durableW0, "fra1", 2),
		durableSlot("k", durableW0, "fra1", 4),
		durableSlot("k", durableW0, "par1", 7),
		durableSlot("k", durableW1, "ams1", 2),
		durableSlot("k", durableW1, "fra1", 1),
		durableSlot(odd, durableW2, "", 1),
		durableSlot(odd, durableW2, "fra1", 8),
		durableSlot("k", durableW2, "fra1", 3),
	}
	slices.SortFunc(want, crdt.CompareSlots)
	db = durableOpen(t, dir, "fra1", nil)
	defer db.Close()
	got, seq := durableLoadAll(t, db)
	if !slices.Equal(got, want) || seq != 14 {
		t.Fatalf("after reopen Load() = %v, seq %d\nwant %v, seq 14", got, seq, want)
	}
	if st := db.Stats(); st.LastLoadSlots != len(want) {
		t.Errorf("Stats().LastLoadSlots = %d, want %d", st.LastLoadSlots, len(want))
	}

	for _, tc := range []struct {
		before int64
		want   []crdt.Slot
	}{
		{math.MinInt64, want},
		{durableW0, want},
		{durableW1, want[3:]},
		{durableW2 + 1, nil},
	} {
		if err := db.DropBefore(tc.before); err != nil {
			t.Fatal(err)
		}
		if got, seq := durableLoadAll(t, db); !slices.Equal(got, tc.want) || seq != 14 {
			t.Errorf("after DropBefore(%d) Load() = %v, seq %d\nwant %v, seq 14", tc.before, got, seq, tc.want)
		}
	}
}

// TestDurableKeepsMax writes a count, then lower ones, through memtable
// flushes and a full compaction (where Pebble runs the merger on partial
// operand stacks) and a reopen: the stored count stays the highest written.
func TestDurableKeepsMax(t *testing.T) {
	dir := t.TempDir()
	db := durableOpen(t, dir, "fra1", nil)
	save := func(own, remote uint64) {
		t.Helper()
		err := db.SaveFlush(
			[]crdt.Slot{durableSlot("k", durableW1, "fra1", own)},
			[]crdt.Slot{durableSlot("k", durableW1, "par1", remote)}, 1)
		if err != nil {
			t.Fatal(err)
		}
	}
	check := func(step string, own, remote uint64) {
		t.Helper()
		want := []crdt.Slot{durableSlot("k", durableW1, "fra1", own), durableSlot("k", durableW1, "par1", remote)}
		if got, _ := durableLoadAll(t, db); !slices.Equal(got, want) {
			t.Errorf("%s: Load() = %v, want %v", step, got, want)
		}
	}
	save(10, 20)
	save(3, 30)
	check("in memtable", 10, 30)
	if err := db.pdb.Flush(); err != nil {
		t.Fatal(err)
	}
	save(7, 5)
	if err := db.pdb.Flush(); err != nil {
		t.Fatal(err)
	}
	save(1<<40, 1)
	check("across tables", 1<<40, 30)
	if err := db.pdb.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
		t.Fatal(err)
	}
	check("compacted", 1<<40, 30)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = durableOpen(t, dir, "fra1", nil)
	defer db.Close()
	save(2, 2)
	check("reopened", 1<<40, 30)
}

func TestDurableErrors(t *testing.T) {
	dir := t.TempDir()
	db := durableOpen(t, dir, "fra1", nil)
	if err := db.SaveFlush([]crdt.Slot{durableSlot("k", durableW1, "fra1", 1)}, nil, 1); err != nil {
		t.Fatal(err)
	}

	err := db.SaveFlush([]crdt.Slot{durableSlot("k", durableW1, "fra1", 5), durableSlot("k", durableW1, "par1", 5)}, nil, 2)
	if !errors.Is(err, ErrReplicaMismatch) {
		t.Errorf("SaveFlush of another replica's own slot: %v, want ErrReplicaMismatch", err)
	}
	long := strings.Repeat("x", 256)
	if err := db.SaveFlush(nil, []crdt.Slot{durableSlot("k", durableW1, long, 5)}, 3); err == nil {
		t.Error("SaveFlush of a 256-byte remote replica name succeeded")
	}
	want := []crdt.Slot{durableSlot("k", durableW1, "fra1", 1)}
	if got, seq := durableLoadAll(t, db); !slices.Equal(got, want) || seq != 1 {
		t.Errorf("a failed SaveFlush wrote: Load() = %v, seq %d; want %v, seq 1", got, seq, want)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	if db, err := OpenDB(dir, "par1", &DBOptions{Logger: durableQuietLogger{}}); !errors.Is(err, ErrReplicaMismatch) {
		if db != nil {
			db.Close()
		}
		t.Errorf("OpenDB of fra1's directory as par1: %v, want ErrReplicaMismatch", err)
	}

	for name, call := range map[string]func() error{
		"SaveFlush":  func() error { return db.SaveFlush(nil, nil, 1) },
		"Load":       func() error { _, _, _, err := db.Load(); return err },
		"DropBefore": func() error { return db.DropBefore(durableW1) },
		"Close":      db.Close,
	} {
		if err := call(); !errors.Is(err, ErrDBClosed) {
			t.Errorf("%s after Close: %v, want ErrDBClosed", name, err)
		}
	}
	if st := db.Stats(); st.DiskBytes != 0 || st.Flushes != 1 {
		t.Errorf("Stats() after Close = %+v, want no disk bytes and 1 flush", st)
	}
	var zero DB
	if _, _, _, err := zero.Load(); !errors.Is(err, ErrDBClosed) {
		t.Errorf("Load on a zero DB: %v, want ErrDBClosed", err)
	}
}

func TestDurableCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name       string
		key, value []byte
	}{
		{"own value not a uvarint", appendOwnKey(nil, durableW1, "k"), []byte{0x80}},
		{"own value with trailing bytes", appendOwnKey(nil, durableW1, "k"), []byte{1, 2}},
		{"own key without window", []byte{tagOwn, 1, 2}, []byte{1}},
		{"remote replica past the key", []byte{tagRemote, 0, 0, 0, 0, 0, 0, 0, 0, 9, 'a'}, []byte{1}},
		{"stream position of 3 bytes", keySeq, []byte{1, 2, 3}},
		{"unknown tag", []byte("x"), []byte{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := durableOpen(t, t.TempDir(), "fra1", nil)
			defer db.Close()
			if err := db.pdb.Set(tc.key, tc.value, pebble.Sync); err != nil {
				t.Fatal(err)
			}
			if own, remote, _, err := db.Load(); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Load() = %v, %v, %v; want ErrCorrupt", own, remote, err)
			}
		})
	}
}

// TestDurablePowerLoss cuts the power on Pebble's crashable in-memory
// filesystem, keeping what was synced and none, some or all of the rest:
// every SaveFlush and DropBefore that returned is there afterwards, because
// each is a synced batch.
func TestDurablePowerLoss(t *testing.T) {
	for _, unsynced := range []int{0, 50, 100} {
		t.Run(fmt.Sprintf("unsynced=%d%%", unsynced), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			db := durableOpen(t, "db", "fra1", &DBOptions{FS: fs})
			l := crdt.NewLocal("fra1")
			var want crdt.Counters
			for i := range 50 {
				w := durableW1 + int64(i/10)*durableW2
				for k := range 20 {
					l.Add("key"+strconv.Itoa(k*i%7), w, uint64(k))
				}
				if i%10 == 0 && i > 0 {
					l.DropBefore(w - durableW2)
					want.DropBefore(w - durableW2)
					if err := db.DropBefore(w - durableW2); err != nil {
						t.Fatal(err)
					}
				}
				own := l.Delta()
				remote := []crdt.Slot{durableSlot("key1", w, "par1", uint64(i+1))}
				want.Join(own...)
				want.Join(remote...)
				if err := db.SaveFlush(own, remote, uint64(i)); err != nil {
					t.Fatal(err)
				}
			}
			crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced, RNG: rand.New(rand.NewPCG(1, 2))})
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = durableOpen(t, "db", "fra1", &DBOptions{FS: crashed})
			defer db.Close()
			if got, seq := durableLoadAll(t, db); !slices.Equal(got, want.Slots()) || seq != 49 {
				t.Errorf("after power loss Load() = %v, seq %d\nwant %v, seq 49", got, seq, want.Slots())
			}
		})
	}
}

func TestDurableConcurrent(t *testing.T) {
	db := durableOpen(t, t.TempDir(), "fra1", nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20 {
				own := []crdt.Slot{durableSlot("k"+strconv.Itoa(g), durableW1, "fra1", uint64(i+1))}
				if err := db.SaveFlush(own, nil, uint64(i)); err != nil && !errors.Is(err, ErrDBClosed) {
					t.Error(err)
				}
				if _, _, _, err := db.Load(); err != nil && !errors.Is(err, ErrDBClosed) {
					t.Error(err)
				}
				db.Stats()
			}
		})
	}
	time.Sleep(5 * time.Millisecond)
	if err := db.Close(); err != nil {
		t.Error(err)
	}
	wg.Wait()
}

// The crash test. The parent re-executes the test binary, running only
// TestDurableCrashChild, which counts, flushes and reports on stdout until it
// is killed with SIGKILL. Each report is one line, "DURABLE " and a JSON
// durableEvent. Before each write to the DB the child reports the state the
// DB holds once the write returns ("want"); after it, the own values it
// publishes ("done").
const (
	durableCrashDirEnv   = "EDGELIMIT_DURABLE_CRASH_DIR"
	durableCrashRoundEnv = "EDGELIMIT_DURABLE_CRASH_ROUND"
	durableLinePrefix    = "DURABLE "
	durableCrashWindow   = int64(1_700_000_040_000_000_000)
	durableCrashStep     = int64(60_000_000_000)
)

type durableEvent struct {
	Op        string      // "start", "want", "done"
	Seq       uint64      // want: the stream position the DB holds after the write
	Slots     []crdt.Slot // want: every slot the DB holds after the write, CompareSlots order
	Floor     int64       // want of a DropBefore: the window dropped before; 0 otherwise
	Published []crdt.Slot // done: own slots published after the write
}

func TestDurableCrashChild(t *testing.T) {
	dir := os.Getenv(durableCrashDirEnv)
	if dir == "" {
		t.Skip("the child process of TestDurableCrash; runs only when started by it")
	}
	round, _ := strconv.Atoi(os.Getenv(durableCrashRoundEnv))
	emit := func(e durableEvent) {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		// One write per line, unbuffered: a line written is in the pipe even
		// if the process is killed right after.
		if _, err := os.Stdout.Write(append(append([]byte(durableLinePrefix), b...), '\n')); err != nil {
			t.Fatal(err)
		}
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(2) // not t.Fatal: the parent must see the child end on its own
	}

	db, err := OpenDB(dir, "fra1", &DBOptions{Logger: durableQuietLogger{}})
	if err != nil {
		fail(err)
	}
	own, remote, seq, err := db.Load()
	if err != nil {
		fail(err)
	}
	// The restart contract: Restore before the first Add or Delta.
	l := crdt.NewLocal("fra1")
	l.Restore(own...)
	var durable crdt.Counters // what the DB holds, own and remote
	durable.Join(own...)
	durable.Join(remote...)
	window := durableCrashWindow
	for _, s := range append(own, remote...) {
		window = max(window, s.Window)
	}
	emit(durableEvent{Op: "start", Seq: seq, Slots: durable.Slots()})

	rng := rand.New(rand.NewPCG(uint64(round), 7))
	add := func(n int) {
		for range n {
			l.Add("api_key="+strconv.Itoa(rng.IntN(30)), window, 1+rng.Uint64N(3))
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for flush := 1; time.Now().Before(deadline); flush++ {
		if flush%6 == 0 { // a new window; drop those before the previous one
			window += durableCrashStep
			floor := window - durableCrashStep
			l.DropBefore(floor)
			durable.DropBefore(floor)
			emit(durableEvent{Op: "want", Seq: seq, Slots: durable.Slots(), Floor: floor})
			if err := db.DropBefore(floor); err != nil {
				fail(err)
			}
			emit(durableEvent{Op: "done"})
		}
		add(100)
		own := l.Delta()
		var applied []crdt.Slot // remote batches "applied from the stream"
		for _, r := range []string{"par1", "ams1"} {
			for range 3 {
				k := "api_key=" + strconv.Itoa(rng.IntN(30))
				n := durable.Replica(k, window, r) + 1 + rng.Uint64N(5)
				applied = append(applied, durableSlot(k, window, r, n))
			}
		}
		seq += 1 + rng.Uint64N(3)
		durable.Join(own...)
		durable.Join(applied...)
		emit(durableEvent{Op: "want", Seq: seq, Slots: durable.Slots()})
		if err := db.SaveFlush(own, applied, seq); err != nil {
			fail(err)
		}
		emit(durableEvent{Op: "done", Published: own}) // "publish"
		add(50)                                        // hits a crash now would lose
	}
	fail(errors.New("not killed within 2 minutes"))
}

// TestDurableCrash kills a counting, flushing child process with SIGKILL at
// a random point, three times over the same directory, and checks after each
// crash that the DB holds exactly the state of the last write the child
// completed, or of the one it was in (a batch lands whole or not at all), so
// a crash loses only the hits counted since the last flush; that every
// published own value stays held; and that no value the child published,
// before or after a restart, is lower than one it published earlier.
func TestDurableCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()

	type slotID struct {
		key    string
		window int64
	}
	published := make(map[slotID]uint64) // the highest own value published per slot
	floor := int64(math.MinInt64)        // windows before it were dropped
	var loaded []crdt.Slot

	for round := range 3 {
		events, killed := durableRunChild(t, dir, round, 10+rng.IntN(15), time.Duration(rng.IntN(3000))*time.Microsecond)

		// done is the state of the last write the child completed; pending
		// the write it was in when killed, if any.
		var done, pending *durableEvent
		var last *durableEvent
		for i := range events {
			e := &events[i]
			switch e.Op {
			case "start":
				done, pending = e, nil
			case "want":
				pending = e
				last = e
			case "done":
				done, pending = last, nil
				if last.Floor != 0 {
					floor = max(floor, last.Floor)
				}
				for _, s := range e.Published {
					id := slotID{s.Key, s.Window}
					if s.Count < published[id] {
						t.Errorf("round %d: published %v, below %d published before", round, s, published[id])
					}
					published[id] = max(published[id], s.Count)
				}
			}
		}
		if done == nil {
			t.Fatalf("round %d: child reported no state", round)
		}

		db := durableOpen(t, dir, "fra1", nil)
		var seq uint64
		loaded, seq = durableLoadAll(t, db)
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		matches := func(e *durableEvent) bool {
			return e != nil && seq == e.Seq && slices.Equal(loaded, e.Slots)
		}
		switch {
		case matches(done):
			t.Logf("round %d: killed %s; the DB holds the last completed write (%d slots, seq %d)",
				round, killed, len(loaded), seq)
		case matches(pending):
			t.Logf("round %d: killed %s inside a write, which landed whole (%d slots, seq %d)",
				round, killed, len(loaded), seq)
		default:
			t.Fatalf("round %d: after the crash Load() = %v, seq %d\nwant the last completed write %v, seq %d\nor the one in progress %v",
				round, loaded, seq, done.Slots, done.Seq, pending)
		}
		if matches(pending) && pending.Floor != 0 {
			floor = max(floor, pending.Floor)
		}

		// Nothing published is lost.
		held := make(map[slotID]uint64)
		for _, s := range loaded {
			if s.Replica == "fra1" {
				held[slotID{s.Key, s.Window}] = s.Count
			}
		}
		for id, n := range published {
			if id.window >= floor && held[id] < n {
				t.Errorf("round %d: key %q window %d published %d, holds %d after the crash", round, id.key, id.window, n, held[id])
			}
		}
	}

	// The restart: what Local hands out next is never below what was
	// published, and it republishes everything restored.
	l := crdt.NewLocal("fra1")
	l.Restore(loaded...)
	l.Add("api_key=1", durableCrashWindow+100*durableCrashStep, 1) // a hit after the restart
	next := make(map[slotID]uint64)
	for _, s := range l.Delta() {
		next[slotID{s.Key, s.Window}] = s.Count
	}
	for id, n := range published {
		if id.window >= floor && next[id] < n {
			t.Errorf("after the restart Delta publishes %d for key %q window %d, published %d before", next[id], id.key, id.window, n)
		}
	}
}

// durableRunChild runs TestDurableCrashChild on dir, kills it with SIGKILL
// after it reported flushes completed writes and a further delay, and returns
// every event it reported and a description of when it was killed.
func durableRunChild(t *testing.T, dir string, round, flushes int, delay time.Duration) ([]durableEvent, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDurableCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), durableCrashDirEnv+"="+dir, durableCrashRoundEnv+"="+strconv.Itoa(round))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		events []durableEvent
		killed string
	)
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 16<<20)
	timeout := time.AfterFunc(time.Minute, func() { _ = cmd.Process.Kill() })
	defer timeout.Stop()
	dones := 0
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), durableLinePrefix)
		if !ok {
			continue // the testing package's own output
		}
		var e durableEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			// Only the last line can be cut short, by the kill.
			t.Logf("round %d: unreadable line (cut by the kill?): %v", round, err)
			continue
		}
		events = append(events, e)
		if e.Op == "done" {
			dones++
			if dones == flushes {
				go func() {
					time.Sleep(delay)
					_ = cmd.Process.Kill() // SIGKILL: no deferred code, no Close
				}()
				killed = fmt.Sprintf("%v after completed write %d", delay, flushes)
			}
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != -1 || dones < flushes {
		t.Fatalf("round %d: child ended with %v after %d completed writes, not killed after %d\nstderr:\n%s",
			round, err, dones, flushes, stderr.String())
	}
	return events, killed
}

// durableState writes a new DB in dir in flushes of batch slots: every key
// of keys counted by six replicas (fra1 own, five remote) in two windows, as
// in a busy global limit. It then closes Pebble the way a crash leaves it,
// with the last memtable in the write-ahead log only.
func durableState(b *testing.B, dir string, keys, batch int) {
	b.Helper()
	db := durableOpen(b, dir, "fra1", nil)
	replicas := []string{"fra1", "par1", "ams1", "iad1", "sfo1", "sin1"}
	var own, remote []crdt.Slot
	seq := uint64(0)
	for k := range keys {
		key := "api_key=" + strconv.Itoa(k)
		for _, w := range []int64{durableW1, durableW2} {
			for i, r := range replicas {
				s := durableSlot(key, w, r, uint64(k+i+1))
				if r == "fra1" {
					own = append(own, s)
				} else {
					remote = append(remote, s)
				}
			}
		}
		if len(own)+len(remote) >= batch || k == keys-1 {
			seq++
			if err := db.SaveFlush(own, remote, seq); err != nil {
				b.Fatal(err)
			}
			own, remote = own[:0], remote[:0]
		}
	}
	// Not db.Close, which flushes the memtable first.
	db.mu.Lock()
	defer db.mu.Unlock()
	if err := db.pdb.Close(); err != nil {
		b.Fatal(err)
	}
	db.pdb = nil
}

// BenchmarkSaveFlush is one flush: a synced batch of 1000 slots, each count
// raised since the last flush.
func BenchmarkSaveFlush(b *testing.B) {
	for _, bc := range []struct {
		name        string
		own, remote int
	}{{"own=1000", 1000, 0}, {"own=200/remote=800", 200, 800}} {
		b.Run(bc.name, func(b *testing.B) {
			db := durableOpen(b, b.TempDir(), "fra1", nil)
			defer db.Close()
			own := make([]crdt.Slot, bc.own)
			for i := range own {
				own[i] = durableSlot("api_key="+strconv.Itoa(i), durableW1, "fra1", 0)
			}
			remote := make([]crdt.Slot, bc.remote)
			for i := range remote {
				remote[i] = durableSlot("api_key="+strconv.Itoa(i/4), durableW1, []string{"par1", "ams1", "iad1", "sfo1"}[i%4], 0)
			}
			b.ReportAllocs()
			seq := uint64(0)
			for b.Loop() {
				seq++
				for i := range own {
					own[i].Count += 3
				}
				for i := range remote {
					remote[i].Count += 5
				}
				if err := db.SaveFlush(own, remote, seq); err != nil {
					b.Fatal(err)
				}
			}
			n := float64(b.N)
			b.ReportMetric(n*float64(bc.own+bc.remote)/b.Elapsed().Seconds(), "keys/s")
			b.ReportMetric(b.Elapsed().Seconds()*1000/n, "ms/flush")
		})
	}
}

// BenchmarkLoad is a restart: OpenDB and Load of a state of 1M slots written
// as 1000-slot flushes. s/crash-restart is measured once, before the loop,
// on the directory as a crash leaves it: OpenDB replays the memtable's worth
// of write-ahead log. The loop measures clean restarts (DB.Close flushed the
// memtable): s/open, s/load and their sum s/restart.
func BenchmarkLoad(b *testing.B) {
	const keys = 1_000_000 / 12 // × 2 windows × 6 replicas ≈ 1M slots
	dir := b.TempDir()
	durableState(b, dir, keys, 1000)
	restart := func() (open, load time.Duration, disk uint64) {
		t0 := time.Now()
		db := durableOpen(b, dir, "fra1", nil)
		t1 := time.Now()
		own, remote, _, err := db.Load()
		if err != nil {
			b.Fatal(err)
		}
		open, load = t1.Sub(t0), time.Since(t1)
		if len(own)+len(remote) != keys*12 {
			b.Fatalf("loaded %d+%d slots, want %d", len(own), len(remote), keys*12)
		}
		disk = db.Stats().DiskBytes
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		return open, load, disk
	}
	crashOpen, crashLoad, _ := restart()
	b.ReportAllocs()
	var open, load time.Duration
	var disk uint64
	for b.Loop() {
		o, l, d := restart()
		open, load, disk = open+o, load+l, d
	}
	n := float64(b.N)
	b.ReportMetric(open.Seconds()/n, "s/open")
	b.ReportMetric(load.Seconds()/n, "s/load")
	b.ReportMetric((open+load).Seconds()/n, "s/restart")
	b.ReportMetric((crashOpen + crashLoad).Seconds(), "s/crash-restart")
	b.ReportMetric(float64(disk)/(1<<20), "MiB-disk")
}
